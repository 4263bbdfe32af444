"""One capture: the pipeline from a model and its inputs to checked captures, and the modality adapters that enter it."""
