"""The head atlas on a circuit built by hand: a two-layer GPT-2 whose weights are set so that layer 0's
head 0 copies each position's previous token into the residual stream and layer 1's head 0 attends
from a token to the one after that token's earlier copy — an induction head (Olsson et al. 2022) made
of a previous-token head. The atlas must find both, and nothing else of the kind; its induction score
must equal the one read from the model's own eager attention (``output_attentions``) on the same
repeated random sequences, an independent reference for attnviz's recomputation."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModel, GPT2Config

from attnviz.analysis import head_atlas
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.atlas import random_repeats

VOCAB, POSITIONS = 24, 40
# the residual stream: [token one-hot | position one-hot | previous token one-hot]
TOKEN, POSITION, PREVIOUS = 0, VOCAB, VOCAB + POSITIONS
D = 2 * VOCAB + POSITIONS  # 88 = 2 heads × 44 dims, each ≥ VOCAB and POSITIONS
SHARP = 2.0  # the query and key weights: each head's chosen key wins by ~28 logits
LENGTH, SEQUENCES = 10, 6  # the atlas' random sequences: 6 × two copies of 10 tokens


def _induction_gpt2(attn_implementation: str = "sdpa"):
    """GPT-2 (2 layers × 2 heads, no MLP) wired as a previous-token head (L0·H0) feeding an induction
    head (L1·H0); the other two heads have zero queries, keys and values (uniform, writing nothing)."""
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        n_embd=D,
        n_layer=2,
        n_head=2,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = AutoModel.from_config(config, attn_implementation=attn_implementation).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for block in model.h:  # LayerNorms as the identity's shape: gain 1, bias 0
            block.ln_1.weight.fill_(1.0)
            block.ln_2.weight.fill_(1.0)
        model.ln_f.weight.fill_(1.0)
        model.wte.weight[torch.arange(VOCAB), TOKEN + torch.arange(VOCAB)] = 1.0
        model.wpe.weight[torch.arange(POSITIONS), POSITION + torch.arange(POSITIONS)] = 1.0
        # c_attn is a Conv1D: x @ W, W [D, 3D] = [Q | K | V], head 0 in the first D/2 columns of each
        qkv = model.h[0].attn.c_attn.weight
        for p in range(POSITIONS - 1):  # L0·H0: the query at position p+1 meets the key at p
            qkv[POSITION + p + 1, p] = SHARP
            qkv[POSITION + p, D + p] = SHARP
        for t in range(VOCAB):  # its value is the key's token, written to the previous-token dims
            qkv[TOKEN + t, 2 * D + t] = 1.0
            model.h[0].attn.c_proj.weight[t, PREVIOUS + t] = 0.15  # ≈ 1 / the LayerNorm's scale
        qkv = model.h[1].attn.c_attn.weight
        for t in range(VOCAB):  # L1·H0: the query's token meets the keys whose previous token it is
            qkv[TOKEN + t, t] = SHARP
            qkv[PREVIOUS + t, D + t] = SHARP
    return model


def _corpus(count: int = 12, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, POSITIONS, (count,), generator=g).tolist()
    return [" ".join(str(i) for i in torch.randint(0, VOCAB, (n,), generator=g).tolist()) for n in lengths]


def test_the_atlas_finds_the_induction_head_built_from_a_previous_token_head():
    model, tok = _induction_gpt2(), IdsTokenizer()
    df = head_atlas(
        model, _corpus(), tokenizer=tok, batch_size=4, random_sequences=SEQUENCES, random_length=LENGTH, progress=False
    )
    roles = {(int(r.layer), int(r.head)): r.roles.split(", ") for r in df.itertuples()}
    assert "previous_token" in roles[0, 0] and "positional" in roles[0, 0]
    assert df.set_index(["layer", "head"]).loc[(0, 0), "positional_offset"] == -1
    assert [head for head, met in roles.items() if "induction" in met] == [(1, 0)]
    assert [head for head, met in roles.items() if "previous_token" in met] == [(0, 0)]

    # the induction score from the model's own eager weights over the same random sequences
    eager = _induction_gpt2("eager")
    expected = np.zeros((2, 2))
    for ids, _, _ in random_repeats(tok, VOCAB, SEQUENCES, LENGTH, seed=0):
        assert len(ids) == 2 * LENGTH  # no special tokens: the second copy starts at LENGTH
        with torch.no_grad():
            maps = eager(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        for layer, m in enumerate(maps):  # [1, head, q, k]: each second-copy token → the one after its copy
            expected[layer] += m[0, :, LENGTH + torch.arange(LENGTH), torch.arange(LENGTH) + 1].sum(-1).double().numpy()
    expected /= SEQUENCES * LENGTH
    got = df.sort_values(["layer", "head"]).induction.to_numpy().reshape(2, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert expected[1, 0] > 0.9 and expected[[0, 0, 1], [0, 1, 1]].max() < 0.2  # the circuit works as built
