"""Statistics over a corpus, over processes: the corpus pass, batching, the head atlas, probe sets, checkpoints and signals."""
