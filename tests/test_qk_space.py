"""One head's query–key space (AttentionViz): against scikit-learn's PCA, the model's own eager
weights (the normalisation changes no softmax row; a GQA head reads its own group's key), sampling,
refusals, and the WebGL figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.analysis import qk_space, qk_vectors
from attnviz.analysis.qk_space import token_contexts
from attnviz.data.words import TokenSequence, words_from_offsets
from attnviz.errors import ArgumentTypeError, InputError
from attnviz.figures import qk_space_figure

TEXTS = [
    "The cat sat on the mat because it was tired.",
    "A dog chased the ball, and then it ran home.",
    "My sister bought a new bike; she rides it every day.",
]


@pytest.fixture(scope="module")
def bert_caps(tiny_bert_words):
    model, tok = tiny_bert_words
    return attnviz.capture(model, TEXTS, tok, keep_weights=True)


@pytest.fixture(scope="module")
def llama_caps(tiny):
    model = tiny("llama", "eager")  # 4 query heads over 2 key/value heads
    g = torch.Generator().manual_seed(1)
    return [
        attnviz.capture(model, input_ids=torch.randint(3, 120, (1, n), generator=g), keep_weights=True) for n in (9, 14)
    ]


def _softmax_rows(cap, vectors, text: int, layer: int, head: int, part: str | None = None) -> torch.Tensor:
    """softmax(scale · q'·k'ᵀ + bias) over the allowed keys, from the transformed vectors alone."""
    rows, keys = vectors.spans[text]
    q, k = vectors.queries[rows].double(), vectors.keys[keys].double()
    rec = cap.layer(layer, part)
    s = q @ k.T * rec.scaling
    bias = rec.bias_part()
    if bias is not None:
        s = s + bias[head if bias.shape[0] > 1 else 0].double()
    s = s.masked_fill(~cap.allowed(layer, part=part), float("-inf"))
    return s.softmax(-1)


@pytest.mark.parametrize("fixture", ["bert_caps", "llama_caps"])
def test_normalisation_changes_no_softmax_row_and_each_head_reads_its_own_group(request, fixture):
    """For every layer and head, the weights from the translated and scaled vectors are the model's own
    eager weights: the translation only shifts each row by q·t, the scaling cancels in q·k — and a GQA
    head (llama: 4 heads, 2 KV heads) must be given its own group's key for this to hold."""
    caps = request.getfixturevalue(fixture)
    for layer in caps[0].layer_indices():
        for head in range(caps[0].n_heads):
            vectors = qk_vectors(caps, layer, head)
            assert vectors.normalised and vectors.translation.norm() > 0 and vectors.scaling != 1.0
            for text, cap in enumerate(caps):
                own = cap.layer(layer).weights[head].double()
                assert (_softmax_rows(cap, vectors, text, layer, head) - own).abs().max() < 2e-5


def test_normalisation_is_attentionviz(bert_caps):
    """The keys' mean lands on the queries' mean and both mean norms are equal afterwards."""
    raw = qk_vectors(bert_caps, 1, 0, normalise=False)
    vectors = qk_vectors(bert_caps, 1, 0)
    assert raw.scaling == 1.0 and raw.translation.abs().max() == 0
    t = raw.queries.double().mean(0) - raw.keys.double().mean(0)
    assert torch.allclose(vectors.translation.double(), t, atol=1e-5)
    assert torch.allclose(
        vectors.queries.double().mean(0) / vectors.scaling, vectors.keys.double().mean(0) * vectors.scaling, atol=1e-4
    )
    assert vectors.queries.norm(dim=-1).mean().item() == pytest.approx(
        vectors.keys.norm(dim=-1).mean().item(), rel=1e-5
    )


def test_gqa_keys_come_from_the_heads_group(llama_caps):
    cap = llama_caps[0]
    for head in range(cap.n_heads):
        vectors = qk_vectors(cap, 0, head, normalise=False)
        assert vectors.kv_head == head // 2 and vectors.shared == 2
        assert torch.equal(vectors.keys, cap.k(0)[head // 2].float())
        assert torch.equal(vectors.queries, cap.q(0)[head].float())


def test_pca_equals_scikit_learn(bert_caps):
    from sklearn.decomposition import PCA

    df = qk_space(bert_caps, 1, 2, dims=3)
    vectors = qk_vectors(bert_caps, 1, 2)
    points = torch.cat([vectors.queries, vectors.keys]).double().numpy()
    pca = PCA(n_components=3).fit(points)
    reference = pca.transform(points)
    ours = df[["x", "y", "z"]].to_numpy()
    signs = np.sign((ours * reference).sum(0))  # a component's sign is arbitrary
    assert np.abs(ours - reference * signs).max() < 1e-4
    assert df.attrs["transform"]["explained_variance_ratio"] == pytest.approx(pca.explained_variance_ratio_, abs=1e-6)
    assert len(df) == len(points) and (df.kind == "query").sum() == len(vectors.queries)


def test_rows_name_each_token(bert_caps):
    df = qk_space(bert_caps, 0, 0)
    assert list(df.columns[:8]) == ["kind", "text", "position", "token", "word", "token_class", "context", "norm"]
    cap = bert_caps[1]
    keys = df[(df.kind == "key") & (df.text == 1)]
    assert keys.position.tolist() == list(range(cap.n_tokens))
    assert keys.token.tolist() == cap.token_labels
    assert keys.norm.to_numpy() == pytest.approx(cap.k(0)[0].norm(dim=-1).numpy(), rel=1e-6)
    dog = keys[keys.token == "dog"].iloc[0]
    assert dog.word == "dog" and dog.token_class == "word" and "[dog]" in dog.context
    assert keys.iloc[0].token_class == "first" and keys.iloc[-1].token_class == "special"
    assert set(keys[keys.token == ","].token_class) == {"punctuation"}
    assert "L0·H0" in df.attrs["description"] and "AttentionViz" in df.attrs["description"]


def _contexts(df, text: int = 0) -> list[str]:
    return df[(df.kind == "key") & (df.text == text)].context.tolist()


def test_context_is_the_text_around_the_token_with_its_spaces(bert_caps, tiny_bert_words, smol_tokenizer):
    """A point's context is the text around its token (four tokens each side), spaces as in the text,
    the token bracketed — a word piece inside its word; a special token by its string. It was the
    labels run together: '[CLS]Thecat[sat]onthematbecause', 'Unbelieva[bly],thehuggingface'."""
    contexts = _contexts(qk_space(bert_caps, 0, 0))  # [CLS] The cat sat on the mat because it was tired . [SEP]
    assert contexts[3] == "[CLS] The cat [sat] on the mat because"
    assert contexts[6] == "cat sat on the [mat] because it was tired"
    assert contexts[0] == "[[CLS]] The cat sat on" and contexts[1] == "[CLS] [The] cat sat on the"
    assert contexts[-2] == "because it was tired[.] [SEP]" and contexts[-1] == "it was tired. [[SEP]]"
    model, tok = tiny_bert_words
    pieces = attnviz.capture(model, "Unbelievably, the huggingface tokenizer splits words.", tok)
    assert pieces.tokens[1:7] == ["un", "##bel", "##ie", "##va", "##bly", ","]
    contexts = _contexts(qk_space(pieces, 0, 0))
    assert contexts[5] == "Unbelieva[bly], the huggingface"
    assert contexts[2] == "[CLS] Un[bel]ievably,"
    # byte-level BPE (SmolLM2's tokenizer): a token's span holds its leading space, kept outside the brackets
    smol = attnviz.testing.tiny_model("llama", attn_implementation="eager", vocab_size=len(smol_tokenizer))
    cap = attnviz.capture(smol, TEXTS[0], smol_tokenizer)
    assert cap.tokens[:3] == ["The", "Ġcat", "Ġsat"]
    contexts = _contexts(qk_space(cap, 0, 0))
    assert contexts[1] == "The [cat] sat on the mat" and contexts[0] == "[The] cat sat on the"
    assert contexts[-1] == "because it was tired[.]"


def test_context_of_pieces_sharing_a_span_special_tokens_between_and_line_breaks():
    text = "a 小\nb"
    tokens = ["<s>", "a", "Ġ", "å", "°", "Ċ", "b", "</s>", "<s>"]  # 小 is two byte-level pieces
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3), (2, 3), (3, 4), (4, 5), (5, 5), (5, 5)]
    seq = TokenSequence(text, tokens, list(range(len(tokens))), offsets, words_from_offsets(text, offsets, tokens))
    assert token_contexts(seq)[3] == "<s> a [小]↵b </s>"  # either piece brackets the character, shown once
    assert token_contexts(seq)[4] == "<s> a [小]↵b </s> <s>"
    assert token_contexts(seq, window=1)[1] == "<s> [a]"
    assert token_contexts(seq, window=2)[7] == "↵b [</s>] <s>"


def test_context_without_a_text_is_the_tokens_joined_by_spaces(tiny_bert_words):
    model, _ = tiny_bert_words
    ids = torch.arange(100, 112)[None]
    cap = attnviz.capture(model, input_ids=ids)  # no text: the tokens are the ids
    contexts = _contexts(qk_space(cap, 0, 0))
    assert contexts[5] == "101 102 103 104 [105] 106 107 108 109"
    assert contexts[0] == "[100] 101 102 103 104"
    tokens = ["[CLS]", "the", "cat", "[SEP]"]
    bare = TokenSequence("", tokens, [0, 1, 2, 3], [(0, 0)] * 4, [])  # offsets that are no spans of a text
    assert token_contexts(bare)[2] == "[CLS] the [cat] [SEP]"


def test_cross_attention_reads_decoder_queries_and_encoder_keys(tiny):
    model = tiny("bart", "eager")
    cap = attnviz.capture(
        model, input_ids=torch.arange(3, 15)[None], decoder_input_ids=torch.arange(3, 8)[None], keep_weights=True
    )
    df = qk_space(cap, 0, 1, part="cross", normalise=False)
    assert (df.kind == "query").sum() == 5 and (df.kind == "key").sum() == 12
    vectors = qk_vectors(cap, 0, 1, part="cross")
    assert torch.allclose(vectors.queries / vectors.scaling, cap.q(0, "cross")[1].float())
    own = cap.layer(0, "cross").weights[1].double()
    assert (_softmax_rows(cap, vectors, 0, 0, 1, "cross") - own).abs().max() < 2e-5
    with pytest.raises(InputError, match="part"):
        qk_space(cap, 0, 1)


def test_sampling_keeps_the_share_of_queries_and_is_seeded(bert_caps):
    full = qk_space(bert_caps, 0, 0, normalise=False, max_points=None)
    df = qk_space(bert_caps, 0, 0, normalise=False, max_points=20, seed=3)
    again = qk_space(bert_caps, 0, 0, normalise=False, max_points=20, seed=3)
    other = qk_space(bert_caps, 0, 0, normalise=False, max_points=20, seed=4)
    assert len(df) == 20 and (df.kind == "query").sum() == 10  # self-attention: as many queries as keys
    assert df[["text", "position", "kind"]].equals(again[["text", "position", "kind"]])
    assert not df[["text", "position", "kind"]].equals(other[["text", "position", "kind"]])
    assert df.attrs["transform"]["kept"] == 20 and df.attrs["transform"]["points"] == len(full)
    assert f"20 of {len(full)} points (seed 3)" in df.attrs["description"]


def test_tsne_and_umap_embed_every_point(bert_caps):
    pytest.importorskip("umap")
    for method in ("tsne", "umap"):
        df = qk_space(bert_caps, 0, 0, method=method)
        assert np.isfinite(df[["x", "y"]].to_numpy()).all() and len(df) == 2 * sum(c.n_tokens for c in bert_caps)
        assert df.attrs["transform"]["method"] == method


def test_bad_input_is_refused_with_what_to_do(bert_caps, tiny):
    with pytest.raises(InputError, match="unknown method 'lda'"):
        qk_space(bert_caps, 0, 0, method="lda")
    with pytest.raises(InputError, match="dims must be 2 or 3"):
        qk_space(bert_caps, 0, 0, dims=4)
    with pytest.raises(InputError, match="max_points"):
        qk_space(bert_caps, 0, 0, max_points=1)
    with pytest.raises(ArgumentTypeError, match="non-empty list"):
        qk_space([], 0, 0)
    with pytest.raises(attnviz.AttnvizError):
        qk_space(bert_caps, 0, 99)
    sinks = attnviz.capture(tiny("gpt_oss", "eager"), input_ids=torch.arange(3, 12)[None])
    with pytest.raises(InputError, match="normalise=False"):
        qk_space(sinks, 0, 0)
    assert len(qk_space(sinks, 0, 0, normalise=False)) == 18


def test_figure_is_webgl_with_what_a_click_means(bert_caps):
    df = qk_space(bert_caps, 0, 0)
    fig = qk_space_figure(df)
    assert {t.type for t in fig.data} == {"scattergl"} and [t.name for t in fig.data] == ["query", "key"]
    query = fig.data[0]
    assert len(query.x) == (df.kind == "query").sum()
    text, position, kind = query.customdata[0]
    assert kind == "query" and "text" in query.text[0]
    # the description whole, wrapped (one line was cut off at the figure's edge), and the axes named
    subtitle = fig.layout.title.text.split("<sup>", 1)[1].removesuffix("</sup>")
    assert subtitle.replace("<br>", " ") == df.attrs["description"]
    assert max(len(line) for line in subtitle.split("<br>")) <= 110 and "<br>" in subtitle
    ratios = df.attrs["transform"]["explained_variance_ratio"]
    assert fig.layout.xaxis.title.text == f"PC1 ({ratios[0]:.0%} of the variance)"
    assert fig.layout.yaxis.title.text == f"PC2 ({ratios[1]:.0%} of the variance)"
    by_class = qk_space_figure(df, color="token_class")
    assert {t.name for t in by_class.data} == set(df.token_class)
    by_position = qk_space_figure(df, color="position")
    assert list(by_position.data[0].marker.color) == df[df.kind == "query"].position.tolist()
    three = qk_space_figure(qk_space(bert_caps, 0, 0, dims=3))
    assert {t.type for t in three.data} == {"scatter3d"} and three.layout.scene.zaxis.title.text.startswith("PC3")
    tsne = qk_space_figure(qk_space(bert_caps, 0, 0, method="tsne"))
    assert tsne.layout.xaxis.title.text == "t-SNE 1" and tsne.layout.yaxis.title.text == "t-SNE 2"
    with pytest.raises(InputError, match="unknown color"):
        qk_space_figure(df, color="size")


def test_figure_subtitle_never_breaks_inside_a_parenthesis_and_hover_is_escaped():
    """The description is wrapped at 110 characters between words: "(|t| = 5.52)" was split "(|t|<br>= 5.52)"."""
    import pandas as pd

    df = pd.DataFrame({"kind": ["query", "key"], "text": 0, "position": [0, 0], "x": [0.0, 1.0], "y": [1.0, 0.0]})
    df["token"] = df["word"] = df["context"] = "t"
    df["token_class"], df["norm"] = "word", 1.0
    df.attrs["description"] = (
        "L2·H5, encoder: PCA in 2-D of all 54 points, 31% of the variance; keys translated onto the queries' "
        "mean (|t| = 5.52), queries ×0.954 and keys ÷0.954 (AttentionViz's softmax-invariant normalisation)."
    )
    subtitle = qk_space_figure(df).layout.title.text.split("<sup>", 1)[1].removesuffix("</sup>")
    lines = subtitle.split("<br>")
    assert " ".join(lines) == df.attrs["description"] and max(len(line) for line in lines) <= 110
    assert lines[1].startswith("(|t| = 5.52), queries")
    assert all(line.count("(") == line.count(")") for line in lines)
    df["context"], df["word"] = "<s> The [cat] sat & ran", "<s>"  # a BOS like <s> is text, not a tag
    hover = qk_space_figure(df).data[0].text[0]
    assert "<br>&lt;s&gt; The [cat] sat &amp; ran<br>word: &lt;s&gt; ·" in hover


def test_figure_of_twenty_thousand_points_stays_webgl():
    """≥ 20,000 points: one Scattergl trace per kind (WebGL draws them; SVG would not keep up)."""
    import pandas as pd

    n = 20_000
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "kind": ["query", "key"] * (n // 2),
            "text": 0,
            "position": np.arange(n) // 2,
            "token": "t",
            "word": "t",
            "token_class": "word",
            "context": "[t]",
            "norm": 1.0,
            "x": rng.normal(size=n),
            "y": rng.normal(size=n),
        }
    )
    fig = qk_space_figure(df)
    assert [t.type for t in fig.data] == ["scattergl", "scattergl"] and sum(len(t.x) for t in fig.data) == n
