"""qk_attribution: one query–key score taken apart into pairs of residual-stream components.

Each claim against a reference written here, independently of the implementation:

- Σ pairs = the model's score: the capture's (``q·k·scale``), and — independent of attnviz's capture —
  with ``versus`` the difference of two scores of one row, ``log α_ij − log α_iv`` from the model's own
  eager attention weights (``output_attentions``);
- Σ components at a position = the model's hidden state there (``output_hidden_states``), within 1e-5;
- a head's component is what that head wrote: its slice of the model's own output projection applied
  to its output, read by a plain hook here; an MLP's, that MLP's output;
- knocking the top key-side component out of the key's stream, with the layer's norm scale held (the
  test's own RMSNorm), changes the model's score by that component's attributed amount.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import attnviz
from attnviz.errors import InputError, OutOfRangeError, UnsupportedModelError
from attnviz.testing import tiny_model
from attnviz.workflows.capture.models import IdsTokenizer

TEXT = "11 5 7 9 23 4 8 15 3 99 5 7 9 23"
SENTENCE = "The cat sat on the mat because it was tired."
REL = 1e-4  # Σ pairs against a score, float32
RESIDUAL = 1e-5  # Σ components against a hidden state, relative to its largest entry


def _neox(parallel: bool, rotary: float):
    config = tf.GPTNeoXConfig(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=128,
        max_position_embeddings=64,
        rotary_pct=rotary,
        use_parallel_residual=parallel,
        attention_bias=True,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    return tf.AutoModelForCausalLM.from_config(config).eval()


def _gptj():
    config = tf.GPTJConfig(
        n_embd=32,
        n_layer=3,
        n_head=4,
        rotary_dim=4,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    return tf.AutoModelForCausalLM.from_config(config).eval()


#: each family of the issue, tiny and random (weights large enough that the scores are not ≈ 0)
FAMILIES = {
    "gpt2": lambda: tiny_model("gpt2", attn_implementation="eager", initializer_range=0.2),
    "llama": lambda: tiny_model("llama", attn_implementation="eager", initializer_range=0.2),
    "qwen2": lambda: tiny_model("qwen2", attn_implementation="eager", initializer_range=0.2),
    "mistral": lambda: tiny_model("mistral", attn_implementation="eager", initializer_range=0.2),
    "gpt_neox": lambda: _neox(True, 0.5),
    "gpt_neox_sequential": lambda: _neox(False, 0.25),
    "gptj": _gptj,
    "bert": lambda: tiny_model("bert", attn_implementation="eager", initializer_range=0.2),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.manual_seed(0)
    model = FAMILIES[request.param]()
    _random_biases(model)
    tok = IdsTokenizer()
    cap = attnviz.capture(model, TEXT, tokenizer=tok)
    return request.param, model, tok, cap


def _random_biases(model) -> None:
    """Every 1-d parameter moved off its initial value (norm weights 1, biases 0), so that a norm's
    weight or bias, or a projection's bias, left out of the attribution shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def _ids(cap) -> torch.Tensor:
    return torch.tensor([cap.token_ids])


def _reference(model, cap):
    """The model's own hidden states and eager attention weights, from a plain forward."""
    with torch.no_grad():
        out = model(_ids(cap), output_hidden_states=True, output_attentions=True)
    return out.hidden_states, out.attentions


def _assert_adds_up(why, model, cap, hidden, weights):
    layer = why.layer
    # Σ pairs = the capture's score (q·k·scale of the model's own Q and K)
    assert why.total == pytest.approx(why.score, rel=REL, abs=1e-7)
    assert abs(why.total - why.score) <= REL * abs(why.score) + 1e-7
    # Σ components = the model's hidden state at each position (the residual stream entering the layer)
    for n, pos in enumerate(why.positions):
        stream = hidden[layer][0, pos].double()
        total = why.components[:, n].sum(0)
        assert float((total - stream).abs().max()) <= RESIDUAL * float(stream.abs().max())
    # the sides are the matrix's margins, and both add up to the total
    assert why.query_side.sum() == pytest.approx(why.total, rel=1e-9, abs=1e-12)
    assert why.key_side.sum() == pytest.approx(why.total, rel=1e-9, abs=1e-12)
    assert why.pairs["score"].sum() == pytest.approx(why.total, rel=1e-9, abs=1e-12)


def test_pairs_add_up_to_the_models_score_and_components_to_its_hidden_states(family):
    name, model, tok, cap = family
    hidden, weights = _reference(model, cap)
    layer = cap.n_layers - 1
    for head in range(cap.n_heads):
        whys = attnviz.qk_attribution(model, cap, layer, head, 12, [2, 6, 12], tokenizer=tok)
        assert [w.key for w in whys] == [2, 6, 12]
        for why in whys:
            _assert_adds_up(why, model, cap, hidden, weights)
            assert why.passed and why.error < REL
        assert max(abs(w.score) for w in whys) > 0.05  # the scores are not ≈ 0: the test can tell


def test_a_capture_of_some_heads_gives_the_same_attribution_by_the_model_s_numbers(family):
    """capture(heads=[1, 3]) stacks two heads: head 3 is read by its number (GQA: the key/value head it reads),
    bit for bit the attribution of a capture of every head; a head not kept is refused."""
    name, model, tok, cap = family
    some = attnviz.capture(model, TEXT, tokenizer=tok, heads=[1, 3])
    layer = cap.n_layers - 1
    for head in (1, 3):
        want = attnviz.qk_attribution(model, cap, layer, head, 12, 6, tokenizer=tok)
        got = attnviz.qk_attribution(model, some, layer, head, 12, 6, tokenizer=tok)
        assert got.score == want.score and torch.equal(got.matrix, want.matrix), (name, head)
    with pytest.raises(attnviz.HeadNotKeptError):
        attnviz.qk_attribution(model, some, layer, 0, 12, 6, tokenizer=tok)


def test_versus_is_the_difference_of_the_models_own_log_weights(family):
    """s(q, key) − s(q, versus) = log α(q, key) − log α(q, versus), from the model's own eager weights."""
    name, model, tok, cap = family
    hidden, weights = _reference(model, cap)
    layer, q, key, versus = cap.n_layers - 1, 12, 3, 9
    if name == "mistral":  # its window of 4 hides the keys before 9 from the weights (not from the scores)
        key, versus = 10, 11
    for head in range(cap.n_heads):
        why = attnviz.qk_attribution(model, cap, layer, head, q, key, versus=versus, tokenizer=tok)
        alpha = weights[layer][0, head, q].double()
        expected = float(alpha[key].log() - alpha[versus].log())
        assert why.total == pytest.approx(expected, rel=REL, abs=1e-5)
        alone = [attnviz.qk_attribution(model, cap, layer, head, q, k, tokenizer=tok) for k in (key, versus)]
        assert torch.allclose(why.matrix, alone[0].matrix - alone[1].matrix, atol=1e-12)


def test_each_component_is_what_it_wrote(family):
    """A head's component is its output through its slice of the model's own output projection (the
    projection module called here on that head's output alone, its bias off); an MLP's, its output."""
    name, model, tok, cap = family
    if name == "bert":
        pytest.skip("post-LN: a component reaches the next layer through the norms after it, tested above")
    layer, pos = cap.n_layers - 1, 12
    why = attnviz.qk_attribution(model, cap, layer, 0, pos, 4, tokenizer=tok)
    where = {"gpt2": "transformer.h.0/attn.c_proj", "gptj": "transformer.h.0/attn.out_proj"}
    where.update({f: "model.layers.0/self_attn.o_proj" for f in ("llama", "qwen2", "mistral")})
    where.update({f: "gpt_neox.layers.0/attention.dense" for f in ("gpt_neox", "gpt_neox_sequential")})
    block_path, projection_path = where[name].split("/")
    block = model.get_submodule(block_path)
    projection = block.get_submodule(projection_path)
    seen = {}
    handles = [
        projection.register_forward_hook(lambda m, a, o: seen.__setitem__("o", a[0][0, pos].detach())),
        block.mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", o[0, pos].detach())),
    ]
    try:
        with torch.no_grad():
            model(_ids(cap))
    finally:
        for h in handles:
            h.remove()
    d_v = seen["o"].shape[-1] // cap.n_heads
    bias = getattr(projection, "bias", None)
    for head in range(cap.n_heads):
        alone = torch.zeros_like(seen["o"])
        alone[head * d_v : (head + 1) * d_v] = seen["o"][head * d_v : (head + 1) * d_v]
        with torch.no_grad():
            written = projection(alone[None])[0] - (0 if bias is None else bias)
        ours = why.components[why.labels.index(f"L0.H{head}"), 0]
        assert torch.allclose(ours.float(), written, atol=1e-6, rtol=1e-5)
    assert torch.allclose(why.components[why.labels.index("L0.mlp"), 0].float(), seen["mlp"], atol=1e-6)


def test_knocking_out_the_top_key_component_changes_the_score_by_its_share():
    """The linear claim, on the model: the top key-side component taken out of the key's stream, the
    layer's RMSNorm scale held (the norm's output replaced by the test's own), the model's new score
    (captured) moves by the component's attributed share."""
    torch.manual_seed(1)
    model = tiny_model("llama", attn_implementation="eager", initializer_range=0.2, num_hidden_layers=3)
    tok = IdsTokenizer()
    cap = attnviz.capture(model, TEXT, tokenizer=tok)
    layer, head, q, key = 2, 1, 12, 5
    why = attnviz.qk_attribution(model, cap, layer, head, q, key, tokenizer=tok)
    top = next(label for label in why.key_side.index if label != "bias")
    component = why.components[why.labels.index(top), 1].float()
    changed = _knocked_out_score(model, tok, TEXT, layer, head, q, key, component, frozen=True)
    assert why.score - changed == pytest.approx(why.key_side[top], rel=1e-4, abs=1e-5)
    unfrozen = _knocked_out_score(model, tok, TEXT, layer, head, q, key, component, frozen=False)
    assert unfrozen == unfrozen  # reported, not asserted: the norm's scale moves with the stream
    print(
        f"{top}: attributed {why.key_side[top]:.4f}, frozen Δ {why.score - changed:.4f}, unfrozen Δ {why.score - unfrozen:.4f}"
    )


def _knocked_out_score(model, tok, text, layer, head, q, key, component, *, frozen: bool) -> float:
    norm = model.model.layers[layer].input_layernorm

    def held(module, args, out):  # RMSNorm of the stream without the component, the forward's own rms
        x = args[0]
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
        out = out.clone()
        out[:, key] = module.weight * ((x[:, key] - component) * rms[:, key])
        return out

    def moved(module, args):
        x = args[0].clone()
        x[:, key] = x[:, key] - component
        return (x,)

    handle = norm.register_forward_hook(held) if frozen else norm.register_forward_pre_hook(moved)
    try:
        after = attnviz.capture(model, text, tokenizer=tok, layers=[layer])
    finally:
        handle.remove()
    rec = after.layer(layer)
    return float(rec.q[head, q] @ rec.k[after.kv_head_of(head), key]) * rec.scaling


def test_words_resolve_to_their_last_token_and_bad_input_says_what_to_do(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", tokenizer=tok)
    why = attnviz.qk_attribution(model, cap, 1, 0, "it", "cat", tokenizer=tok)
    assert (cap.tokens[why.query], cap.tokens[why.key]) == ("it", "cat")
    assert why.tokens == ("it", "cat", None)
    with pytest.raises(InputError, match="'dog' is not in the text"):
        attnviz.qk_attribution(model, cap, 1, 0, "it", "dog", tokenizer=tok)
    with pytest.raises(OutOfRangeError, match=r"key=99 is out of range: the text has tokens 0\.\.12"):
        attnviz.qk_attribution(model, cap, 1, 0, "it", 99, tokenizer=tok)
    with pytest.raises(OutOfRangeError):
        attnviz.qk_attribution(model, cap, 1, 7, "it", "cat", tokenizer=tok)


def test_a_family_without_residual_facts_is_refused_with_why(tiny):
    model = tiny("gpt_neo", "eager")
    cap = attnviz.capture(model, TEXT, tokenizer=IdsTokenizer())
    with pytest.raises(UnsupportedModelError, match=r"cannot take apart the scores of GPTNeoForCausalLM \('gpt_neo'\)"):
        attnviz.qk_attribution(model, cap, 1, 0, 5, 2, tokenizer=IdsTokenizer())


def test_a_capture_of_another_model_does_not_add_up():
    torch.manual_seed(0)
    one = tiny_model("llama", attn_implementation="eager", initializer_range=0.2)
    other = tiny_model("llama", attn_implementation="eager", initializer_range=0.2)
    with torch.no_grad():  # another checkpoint of the same architecture
        other.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    cap = attnviz.capture(one, TEXT, tokenizer=IdsTokenizer())
    with pytest.raises(attnviz.ValidationError, match="does not add up"):
        attnviz.qk_attribution(other, cap, 1, 0, 12, 3, tokenizer=IdsTokenizer())


def test_no_hook_survives_also_when_the_forward_raises():
    model = tiny_model("gpt2", attn_implementation="eager")
    cap = attnviz.capture(model, TEXT, tokenizer=IdsTokenizer())

    def hooks():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    before = hooks()
    attnviz.qk_attribution(model, cap, 1, 0, 12, 3, tokenizer=IdsTokenizer())
    assert hooks() == before

    def boom(*args):
        raise RuntimeError("boom")

    handle = model.transformer.h[0].mlp.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            attnviz.qk_attribution(model, cap, 1, 0, 12, 3, tokenizer=IdsTokenizer())
        assert hooks() == before + 1
    finally:
        handle.remove()


# ---------------------------------------------------------------- the command line
@pytest.mark.slow
def test_explain_prints_the_top_pairs_and_the_check(capsys):
    from attnviz.cli import main

    code = main(
        ["explain", "minilm", SENTENCE, "--layer", "4", "--head", "2", "--query", "it", "--key", "cat"]
        + ["--versus", "mat", "--top", "3"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "layer 4 head 2: 'it' @8 → 'cat' @2 − s(→ 'mat' @6)" in out
    assert "top 3 pairs (query component × key component):" in out and "key side, top 5:" in out
    model, tok = attnviz.load_model("minilm")
    cap = attnviz.capture(model, SENTENCE, tokenizer=tok)
    why = attnviz.qk_attribution(model, cap, 4, 2, "it", "cat", versus="mat", tokenizer=tok)
    assert f"the model's score {why.score:+.4f}, Σ pairs {why.total:+.4f}" in out
    assert len(out.split("top 3 pairs")[1].split("query side")[0].strip().splitlines()) == 5  # title, header, 3


@pytest.mark.slow
def test_explain_says_a_bad_word_on_one_line(capsys):
    from attnviz.cli import main

    code = main(["explain", "minilm", SENTENCE, "--layer", "4", "--head", "2", "--query", "it", "--key", "dog"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: 'dog' is not in the text; its words are ['[CLS]', 'The', 'cat'")


# ---------------------------------------------------------------- the carried real models


def _carried_adds_up(model, tok, heads) -> None:
    """Each head's pairs add up on the text, for three keys at once, and ``versus`` is the model's log-weight ratio."""
    cap = attnviz.capture(model, SENTENCE, tokenizer=tok)
    hidden, weights = _reference(model, cap)
    for layer, head in heads:
        for why in attnviz.qk_attribution(model, cap, layer, head, "it", ["cat", "mat", 0], tokenizer=tok):
            _assert_adds_up(why, model, cap, hidden, weights)
        why = attnviz.qk_attribution(model, cap, layer, head, "it", "cat", versus="mat", tokenizer=tok)
        alpha = weights[layer][0, head, why.query].double()
        assert why.total == pytest.approx(float(alpha[why.key].log() - alpha[why.versus].log()), rel=REL, abs=1e-4)


@pytest.mark.slow
def test_minilm_adds_up():
    _carried_adds_up(*attnviz.load_model("minilm", attn_implementation="eager"), [(0, 0), (3, 5), (5, 11)])


@pytest.mark.slow
def test_smollm2_adds_up(smollm2_eager):
    _carried_adds_up(*smollm2_eager, [(0, 0), (15, 3), (29, 8)])


@pytest.mark.slow
def test_smollm2_induction_heads_key_side_is_led_by_a_previous_token_head(smollm2_eager):
    """The lesson of docs/guides/why.md, held: on repeated random tokens the induction head L18·H6's key side
    is led by L16·H0, the strongest previous-token head; taking it out of the key's stream with the norm's
    scale held moves the model's score by its share (the unfrozen change is printed, not asserted)."""
    from attnviz.analysis import detect_heads

    model, tok = smollm2_eager
    half = torch.randint(1000, 10000, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    text = tok.decode(half + half)
    cap = attnviz.capture(model, text, tokenizer=tok)
    previous = detect_heads(cap, "previous_token").nlargest(1, "score")
    ids, query = cap.token_ids, cap.n_tokens - 2
    key = next(p + 1 for p in range(query) if ids[p] == ids[query])
    why = attnviz.qk_attribution(model, cap, 18, 6, query, key, tokenizer=tok)
    top = why.key_side.index[0]
    assert top == f"L{int(previous.layer.iloc[0])}.H{int(previous['head'].iloc[0])}" == "L16.H0"
    component = why.components[why.labels.index(top), 1].float()
    frozen = _knocked_out_score(model, tok, text, 18, 6, query, key, component, frozen=True)
    assert why.score - frozen == pytest.approx(why.key_side[top], rel=1e-3)
    free = _knocked_out_score(model, tok, text, 18, 6, query, key, component, frozen=False)
    print(
        f"L18·H6 {top}: attributed {why.key_side[top]:.3f}, frozen Δ {why.score - frozen:.3f}, free Δ {why.score - free:.3f}"
    )
