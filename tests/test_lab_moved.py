"""The AttentionLab's "moved" (#20): each key's share of what the head writes into the query,
α_ij·‖f(x_j)‖ / Σ_j' α_ij'·‖f(x_j')‖, beside its weight — the library's row shares against a hand
computation from the model's own output projection and the capture's tensors, the lab's sentences
against the row's numbers, and the Lab switched to "moved" and back in a browser."""

import math
import re

import numpy as np
import pytest
import torch
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID
from attnviz.dashboard.lab_view import moved_lines, percent, stats_line
from test_dashboard import choose, no_console_errors, open_tab, poll, show_heatmap_in_tokens, wait_status

import attnviz
from attnviz import figures
from attnviz.errors import InputError

ZH = "我家的小猫很可爱，它很好动。"
CAT = "The cat sat on the mat because it was tired."
SWITCHES = [
    dict(causal=None, scale=True, temperature=1.0),
    dict(causal=False, scale=False, temperature=2.5),
    dict(causal=True, scale=0.5, temperature=0.5),
]


@pytest.fixture(scope="module")
def llama(smol_tokenizer):
    """A tiny random Llama (GQA: 4 heads over 2 KV heads) reading SmolLM2's vocabulary, and its capture
    of the Chinese example with a BOS."""
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer))
    return model, attnviz.capture(model, ZH, smol_tokenizer, add_bos=True)


@pytest.fixture(scope="module")
def bert_cat(tiny_bert_words):
    model, tokenizer = tiny_bert_words
    return attnviz.capture(model, CAT, tokenizer)


def by_hand(cap, layer, head, query, **switches):
    """α_ij·‖f(x_j)‖ / Σ from the capture's own weights and value norms."""
    alpha = cap.attention(layer, head, **switches)[query]
    moved = alpha * cap.value_norms(layer)[head]
    return alpha, moved, moved / moved.sum()


def test_value_norms_are_the_output_projection_applied_to_the_captured_values(llama):
    model, cap = llama
    config = model.config
    group = config.num_attention_heads // config.num_key_value_heads
    for layer in range(config.num_hidden_layers):
        w_o = model.model.layers[layer].self_attn.o_proj.weight.detach()  # [hidden, head·d]
        v = cap.layer(layer).v.float()  # [kv_head, key, d]
        d = v.shape[-1]
        for head in range(config.num_attention_heads):
            f = v[head // group] @ w_o[:, head * d : (head + 1) * d].T  # [key, hidden]: f_h(x_j) = W_O^h v_j
            torch.testing.assert_close(cap.value_norms(layer)[head], f.norm(dim=-1), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("switches", SWITCHES)
def test_row_shares_equal_a_hand_computation(llama, switches):
    _, cap = llama
    query = cap.token_labels.index("它₂")
    for layer in range(cap.n_layers):
        for head in range(cap.layer(layer).q.shape[0]):
            alpha, moved, share = by_hand(cap, layer, head, query, **switches)
            got_w, got_m, got_s = attnviz.analysis.row_shares(cap, layer, head, query, **switches)
            torch.testing.assert_close(got_w, alpha, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(got_m, moved, rtol=1e-5, atol=1e-9)
            torch.testing.assert_close(got_s, share, rtol=1e-5, atol=1e-7)
            assert float(got_s.sum()) == pytest.approx(1.0, abs=1e-5)
    table = attnviz.analysis.moved_shares(cap, 1, 2, query, **switches)
    alpha, moved, share = by_hand(cap, 1, 2, query, **switches)
    assert list(table.columns) == ["label", "weight", "moved", "moved_share", "ratio"]
    assert table.index.name == "key" and list(table["label"]) == cap.token_labels
    np.testing.assert_allclose(table["moved_share"], share.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(table["weight"], alpha.numpy(), rtol=1e-5, atol=1e-7)
    seen = alpha > 0
    np.testing.assert_allclose(table["ratio"][seen.numpy()], (share / alpha)[seen].numpy(), rtol=1e-4)
    assert table["ratio"][~seen.numpy()].isna().all()


def test_word_shares_follow_the_summed_vectors(llama):
    model, cap = llama
    words = cap.word_labels
    query = words.index("它")
    layer, head = 1, 3
    _, moved, share = attnviz.analysis.row_shares(cap, layer, head, query, words=True)
    # by hand: β (the query word's mean weights), f_h(x_j) from the model's W_O and the captured V, and
    # the norm of the summed vector of each key word's tokens
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    v = cap.layer(layer).v.float()
    d = v.shape[-1]
    w_o = model.model.layers[layer].self_attn.o_proj.weight.detach()
    f = v[head // group] @ w_o[:, head * d : (head + 1) * d].T  # [key, hidden]
    w = cap.words[query]
    beta = cap.attention(layer, head)[w.token_start : w.token_stop].mean(0)  # [key]
    expected = torch.stack(
        [(beta[k.token_start : k.token_stop, None] * f[k.token_start : k.token_stop]).sum(0).norm() for k in cap.words]
    )
    torch.testing.assert_close(moved, expected, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(share, expected / expected.sum(), rtol=1e-4, atol=1e-7)


def numbers(line: str) -> list[float]:
    return [float(x) / 100 for x in re.findall(r"([\d.]+) %", line)]


@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("switches", SWITCHES)
def test_the_lab_text_says_the_rows_own_numbers(llama, bert_cat, words, switches):
    for cap, query_word in ((llama[1], "它"), (bert_cat, "it")):
        names = cap.word_labels if words else cap.token_labels
        query = next(i for i, n in enumerate(names) if n.startswith(query_word))
        kwargs = dict(words=words, part=None, **switches)
        kwargs["causal"] = bool(kwargs["causal"])  # the lab's checklist gives a bool
        for layer, head in ((0, 0), (1, 2)):
            alpha = cap.attention(
                layer,
                head,
                causal=kwargs["causal"],
                scale=kwargs["scale"],
                temperature=kwargs["temperature"],
                words=words,
            )[query]
            if words:  # the word rows' moved share: the capture's moved map (tested above by hand)
                moved = cap.moved(
                    layer,
                    head,
                    causal=kwargs["causal"],
                    scale=kwargs["scale"],
                    temperature=kwargs["temperature"],
                    words=True,
                )[query]
            else:
                moved = alpha * cap.value_norms(layer)[head]
            share = moved / moved.sum()
            lines = moved_lines(cap, layer, head, query, kwargs)
            given = attnviz.analysis.row_shares(cap, layer, head, query, **kwargs)  # as the callback passes them
            assert moved_lines(cap, layer, head, query, kwargs, given) == lines
            for measure in ("weights", "moved"):
                assert stats_line(cap, layer, head, query, measure, kwargs, given) == stats_line(
                    cap, layer, head, query, measure, kwargs
                )
            top = int(alpha.argmax())
            keys = [top] if top == 0 else [top, 0]
            assert len(lines) == len(keys) + 1, lines
            for line, j in zip(lines, keys):
                assert line == (
                    f"{names[j]!r} takes {percent(float(alpha[j]))} of the weight and {percent(float(share[j]))} "
                    f"of what L{layer}·H{head} writes into {names[query]!r}."
                )
                w_said, s_said = numbers(line)
                assert w_said == pytest.approx(float(alpha[j]), abs=0.006)
                assert s_said == pytest.approx(float(share[j]), abs=0.006)
            ratios = {j: float(share[j] / alpha[j]) for j in keys}
            far = max(ratios, key=lambda j: abs(math.log(ratios[j])))
            assert f"{ratios[far]:.2g}× the row's weight-averaged length" in lines[-1]
            assert repr(names[far]) in lines[-1]
            first = stats_line(cap, layer, head, query, "moved", kwargs)
            j = int(share.argmax())
            assert first.startswith(
                f"query {names[query]!r} (#{query}) → {percent(float(share[j]))} of what L{layer}·H{head} writes "
                f"into it comes from {names[j]!r} (weight {float(alpha[j]):.2f}), over {int((alpha > 0).sum())} "
            )


def test_the_bos_line_is_said_only_when_the_bos_is_not_the_top_key(llama):
    _, cap = llama
    query = cap.token_labels.index("它₂")
    kwargs = dict(words=False, part=None, causal=True, scale=True, temperature=1.0)
    for layer in range(cap.n_layers):
        for head in range(4):
            alpha = cap.attention(layer, head)[query]
            said = [line for line in moved_lines(cap, layer, head, query, kwargs) if " takes " in line]
            top_is_bos = int(alpha.argmax()) == 0
            assert len(said) == (1 if top_is_bos else 2)
            assert said[-1].startswith("'<|im_start|>' takes")


def test_query_row_draws_the_moved_shares_beside_the_weights(llama):
    _, cap = llama
    query = cap.token_labels.index("它₂")
    alpha, _, share = by_hand(cap, 1, 2, query)
    fig = figures.query_row(cap, 1, 2, query, measure="moved")
    assert [bar.name for bar in fig.data] == ["moved share", "weight α"]
    np.testing.assert_allclose(np.array(fig.data[0].y), share.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(fig.data[1].y), alpha.numpy(), atol=1e-5)
    j = int(share.argmax())
    assert f"moved (‖α·f(x)‖) — {100 * float(share[j]):.0f} % from {cap.token_labels[j]!r}" in fig.layout.title.text
    plain = figures.query_row(cap, 1, 2, query)  # weights: one trace, the moved share in the hover
    assert len(plain.data) == 1 and "entropy" in plain.layout.title.text
    np.testing.assert_allclose(np.array(plain.data[0].y), alpha.numpy(), atol=1e-5)
    np.testing.assert_allclose([s for _, s in plain.data[0].customdata], share.numpy(), atol=1e-6)
    words = figures.query_row(cap, 1, 2, cap.word_labels.index("它"), measure="moved", words=True)
    assert list(words.layout.xaxis.ticktext) == cap.word_labels
    with pytest.raises(
        InputError, match=r"measure must be 'weights' \(the attention weights α\) or 'moved' .*, got 'norms'"
    ):
        figures.query_row(cap, 1, 2, query, measure="norms")


def test_a_layer_without_value_norms_draws_weights_and_refuses_what_moves(tiny_bert_words):
    model, tokenizer = tiny_bert_words
    cap = attnviz.capture(model, CAT, tokenizer)
    cap.layer(1).value_dots = None  # as a capture saved before value norms existed
    query = cap.token_labels.index("it")
    assert len(figures.query_row(cap, 1, 0, query).data) == 1
    assert moved_lines(cap, 1, 0, query, dict(words=False, part=None, causal=False, scale=True, temperature=1.0)) == []
    with pytest.raises(InputError, match="holds no value norms for layer 1"):
        figures.query_row(cap, 1, 0, query, measure="moved")


@pytest.mark.browser
def test_lab_switches_to_what_moves_and_back(dash_duo, llama_folder, long_llama):
    dash_duo.start_server(create_app({llama_folder: "tiny Llama"}, default_model=llama_folder))
    wait_status(dash_duo, "27 tokens")  # the Chinese example with its BOS
    show_heatmap_in_tokens(dash_duo)
    choose(dash_duo, f"#{ID.layer}", 1)  # L1
    choose(dash_duo, f"#{ID.head}", 2)  # H2
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '它₂'")
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", "L1·H2")
    weights_title = dash_duo.find_element(f"#{ID.lab_graph} .gtitle").text
    assert "entropy" in weights_title and "moved" not in weights_title
    # the page's capture, made again here: the sentences must be this row's own numbers
    model, tokenizer = long_llama
    cap = attnviz.capture(model, ZH, tokenizer, add_bos=True)
    query = cap.token_labels.index("它₂")
    kwargs = dict(words=False, part=None, causal=True, scale=True, temperature=1.0)
    expected = moved_lines(cap, 1, 2, query, kwargs)
    poll(lambda: [e.text for e in dash_duo.find_elements(".lab-moved")] == expected)
    assert dash_duo.find_element(".lab-row").text == stats_line(cap, 1, 2, query, "weights", kwargs)

    dash_duo.find_elements(f"#{ID.measure} input")[1].click()  # Show: moved
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", "moved (‖α·f(x)‖)")
    poll(lambda: dash_duo.find_element(".lab-row").text == stats_line(cap, 1, 2, query, "moved", kwargs))
    _, _, share = attnviz.analysis.row_shares(cap, 1, 2, query, **kwargs)
    drawn = dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.lab_graph} .js-plotly-plot'); return gd.data.map(d => d.name);"
    )
    assert drawn == ["moved share", "weight α"]
    bars = dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.lab_graph} .js-plotly-plot'); return Array.from(gd._fullData[0].y);"
    )
    np.testing.assert_allclose(bars, share.numpy(), atol=1e-5)
    assert [e.text for e in dash_duo.find_elements(".lab-moved")] == expected

    dash_duo.find_elements(f"#{ID.measure} input")[0].click()  # back to the weights
    poll(lambda: "entropy" in dash_duo.find_element(f"#{ID.lab_graph} .gtitle").text)
    poll(lambda: dash_duo.find_element(".lab-row").text == stats_line(cap, 1, 2, query, "weights", kwargs))
    no_console_errors(dash_duo)


def test_every_part_of_an_encoder_decoder(bert_tokenizer):
    """BART: encoder, decoder and cross rows — shares by hand, the lab's lines naming the part."""
    model = attnviz.testing.tiny_model("bart", vocab_size=bert_tokenizer.vocab_size, decoder_start_token_id=102)
    cap = attnviz.capture(model, CAT, bert_tokenizer, target="The cat was tired.")
    for part in ("encoder", "decoder", "cross"):
        queries, keys = cap.sequences(part)
        query = queries.n_tokens - 2
        alpha = cap.attention(1, 1, part=part)[query]
        share = alpha * cap.value_norms(1, part=part)[1]
        share = share / share.sum()
        _, _, got = attnviz.analysis.row_shares(cap, 1, 1, query, part=part)
        torch.testing.assert_close(got, share, rtol=1e-5, atol=1e-7)
        kwargs = dict(words=False, part=part, causal=part == "decoder", scale=True, temperature=1.0)
        lines = moved_lines(cap, 1, 1, query, kwargs)
        assert f"of what {part} L1·H1 writes into {queries.token_labels[query]!r}" in lines[0]
        fig = figures.query_row(cap, 1, 1, query, part=part, measure="moved")
        np.testing.assert_allclose(np.array(fig.data[0].y), share.numpy(), atol=1e-5)
        assert len(fig.data[0].y) == keys.n_tokens
