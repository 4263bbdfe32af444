"""The validation report's one line names ties as ties: float32 errors come in steps of an ulp, so
several heads often share the largest error, and naming one of them alone reads as if it were the worst."""

from attnviz.data.validate import ValidationReport


def _report(errors: list[float]) -> ValidationReport:
    rows = [
        dict(
            part="decoder",
            layer=layer,
            head=0,
            quantity="output",
            rows=4,
            max_abs_error=e,
            rel_error=e,
            tolerance=1e-5,
            passed=True,
        )  # fmt: skip
        for layer, e in enumerate(errors)
    ]
    return ValidationReport(rows, model="tiny", backend="sdpa", dtype="float32", atol=1e-5, rtol=1.3e-6)


def test_the_worst_head_alone_is_named_alone():
    assert "max error 4.77e-07 at L1·H0; " in str(_report([2.4e-7, 4.77e-7, 1e-7])) + "; "


def test_heads_tied_at_the_largest_error_are_counted():
    text = str(_report([4.77e-7, 2.4e-7, 4.77e-7, 4.77e-7]))
    assert "max error 4.77e-07 at L0·H0 and 2 more heads with the same error" in text
