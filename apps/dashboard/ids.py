"""Every component id of the dashboard, in one module (tests and tools use these strings too).

Each view module imports the ids it reads or writes from here, so no id has to travel as an argument
and no view imports the page's layout. The strings never change: saved pages, tests and
``docs/make_screenshots.py`` name components by them.
"""

from __future__ import annotations


class ID:
    """The page's shared controls and the core views."""

    model = "model-select"
    model_hint = "model-hint"  # says the views still show the last capture's model until Run
    text = "text-input"
    example = "example-select"
    run = "run-button"
    bos = "bos-switch"
    message = "message"
    status = "status"
    store = "capture-store"
    part = "part-select"
    part_box = "part-box"
    target = "target-input"
    target_box = "target-box"
    layer = "layer-select"
    head = "head-select"
    words = "word-level"
    measure = "measure"  # "weights" (α) or "moved" (‖α·f(x)‖, what the head moves): every map view reads it
    tabs = "view-tabs"
    url = "page-url"  # dcc.Location: the view in the address (url_state)
    export_format = "export-format"
    csv_button = "csv-button"
    capture_button = "capture-file-button"
    html_button = "html-file-button"
    report_button = "report-file-button"
    figure_button = "figure-image-button"  # the view's figures as PNG/SVG, CJK drawn (assets/figure_image.js)
    figure_done = "figure-image-done"  # dcc.Store: the file names the figure button last downloaded
    download = "download"
    heatmap = "heatmap-graph"
    heads_multi = "head-view-heads"
    head_view = "head-view-graph"
    model_view = "model-view-graph"
    lab_tokens = "lab-tokens"
    lab_query = "lab-query"
    lab_key = "lab-key"  # dcc.Store: the key the Lab highlights ({"key": capture key, "position": p}; the Q·K space)
    lab_switches = "lab-switches"
    lab_temperature = "lab-temperature"  # the slider: log10 of the temperature
    lab_temperature_value = "lab-temperature-value"  # the temperature itself, shown beside the slider
    lab_graph = "lab-graph"
    lab_stats = "lab-stats"
    validation_summary = "validation-summary"
    validation_map = "validation-map"
    provenance = "provenance-table"  # where the capture came from (provenance_view, in the validation tab)
    provenance_json = "capture-provenance"  # hidden, on every tab: the capture's provenance as JSON (figure_image.js)
    comparison = "comparison-graph"
    cost = "cost-tables"
    lab_token = "lab-token"  # pattern-matching type: {"type": lab_token, "index": i}
    # a long text's capture, run as a background job (run_view)
    job = "capture-job"  # dcc.Store: the request a background job captures
    job_done = "capture-job-done"  # dcc.Store: the finished job's request (the server then reads its file)
    job_cancel = "capture-cancel"
    job_progress = "capture-progress"
    job_progress_text = "capture-progress-text"
    job_watch = "capture-job-watch"  # dcc.Interval: on while a background capture runs (is it alive?)
    # the heavy views' background jobs for a long text (jobs_view)
    page = "page-id"  # dcc.Store: this page's own id (made per page load): whose jobs are whose
    view_job = "view-job"  # the job bar: progress, Cancel, Compute
    view_job_progress = "view-job-progress"
    view_job_text = "view-job-text"
    view_job_cancel = "view-job-cancel"
    view_job_start = "view-job-start"
    view_job_poll = "view-job-poll"  # dcc.Interval: on while a job of this page runs
    view_job_done = "view-job-done"  # dcc.Store: set when a job of this page finished (the views draw again)


def view_id(key: str) -> str:
    """The container of one tab's view ("view-heatmap", "view-coref" …)."""
    return f"view-{key}"


class OID:
    """The heatmap's long-text controls (overview_view)."""

    mode = "overview-mode"
    mode_box = "overview-mode-box"
    note = "overview-note"
    view = "overview-view"  # dcc.Store: the shown grid's {"rows": [start, stop, width], "cols": …, "full": bool}
    zoom = "overview-zoom"  # dcc.Store: the heatmap's last relayout that zooms or resets (not resizes)
    shown = "overview-shown"  # dcc.Store: the selection the heatmap on the page was drawn for


class QKID:
    """Why a cell is bright: the heatmap's panel of one score taken apart (qk_view)."""

    panel = "qk-panel"
    note = "qk-note"  # the cell, the model's score, Σ pairs and their error (the check)
    bars = "qk-bars"
    cell = "qk-cell"  # dcc.Store: the clicked cell and the strongest head {"layer", "head", "query", "key", …}
    knock = "qk-knock"  # the button that knocks the strongest head out with attnviz.edits.ablate
    knocked = "qk-knocked"  # what the score and the weight really become, beside the linear prediction
    lab_key = "qk-lab-key"  # the Lab's choice of a key whose score with the Lab's query is taken apart
    lab_note = "qk-lab-note"
    lab_bars = "qk-lab-bars"


class HID:
    """The head view's controls (head_view)."""

    top_k = "head-view-top-k"
    mass = "head-view-mass"
    queries = "head-view-queries"


class GID:
    """The generation controls and the AttentionLab's step slider (generation_view)."""

    generate = "generate-button"
    new_tokens = "new-tokens-input"
    progress = "generate-progress"
    step = "step-slider"
    step_box = "step-box"
    step_text = "step-text"
    step_graph = "step-graph"
    first_new = "step-first-new"  # dcc.Store: the lab's position of new token 0 (None: no steps to replay)


class CID:
    """The Compare view (compare_view)."""

    text = "compare-text"
    model = "compare-model"
    run = "compare-button"
    graph = "compare-graph"
    note = "compare-note"


class AID:
    """The analysis views: Coreference with probe sets (coref_view), Head statistics (stats_view), Rollout
    (rollout_view)."""

    coref_mode = "coref-mode"
    coref_words = "coref-words"
    coref_selection = "coref-selection"
    coref_sinks = "coref-sinks"
    coref_headline = "coref-headline"
    coref_table = "coref-table"
    coref_bars = "coref-bars"
    coref_heatmap = "coref-heatmap"
    coref_word = "coref-word"  # pattern-matching type
    coref_word_page = "coref-word-page"  # a long text's words, 400 a page: which page the chips show
    coref_word_page_of = "coref-word-page-of"  # dcc.Store: the pronoun that page was chosen for
    probe_set = "probe-set"
    probe_run = "probe-run"
    probe_summary = "probe-summary"
    probe_map = "probe-map"
    probe_cancel = "probe-cancel"
    probe_progress = "probe-progress"
    probe_progress_text = "probe-progress-text"
    probe_upload = "probe-upload"  # dcc.Upload: a probe file of the researcher's own (kept on the server)
    probe_format = "probe-format"  # the uploaded file's format, as load_probes names it ("auto": from the file)
    probe_source = "probe-source"  # dcc.Store: the upload's token on the server and its file name
    probe_loaded = "probe-loaded"  # what the loaded file says: its summary line
    probe_problems = "probe-problems"  # the probes it could not use, each with its reason
    probe_problems_box = "probe-problems-box"
    probe_intervals = "probe-intervals"  # the top heads' accuracies with their intervals
    probe_result = "probe-result"  # dcc.Store: the key of the result the server keeps, and its model
    probe_table = "probe-table"  # the per-probe table, a page at a time (a cell opens the probe in the Lab)
    probe_note = "probe-note"
    probe_show = "probe-show"  # which probes the table lists: all, or where the best head is wrong / right
    probe_drill = "probe-drill"  # dcc.Store: the probe on its way to the Lab (its capture key, query, head)
    stats_table = "stats-table"
    stats_source = "stats-source"
    stats_column = "stats-column"
    stats_map = "stats-map"
    rollout_mode = "rollout-mode"
    rollout_graph = "rollout-graph"


class SID:
    """The query–key space (space_view)."""

    source = "space-source"  # this text, or the server's corpus
    method = "space-method"
    color = "space-color"
    normalise = "space-normalise"
    note = "space-note"
    graph = "space-graph"
    drill = "space-drill"  # dcc.Store: a corpus point on its way to the Lab (its text's capture key, position, kind)


class TID:
    """The head atlas (atlas_view)."""

    corpus = "atlas-corpus"  # which corpus the atlas reads
    coreference = "atlas-coreference"
    run = "atlas-run"
    cancel = "atlas-cancel"
    progress = "atlas-progress"
    progress_text = "atlas-progress-text"
    note = "atlas-note"
    graph = "atlas-graph"
    table = "atlas-table"


class EID:
    """Counterfactual edits: the AttentionLab's "apply to the model", the Coreference view's "test it" and
    head-importance map (edit_view)."""

    lab_apply = "edit-lab-apply"
    lab_apply_cancel = "edit-lab-apply-cancel"
    lab_apply_progress = "edit-lab-apply-progress"
    lab_apply_progress_text = "edit-lab-apply-progress-text"
    lab_scope = "edit-lab-scope"
    lab_knock = "edit-lab-knock"  # dcc.Store: the key token positions knocked out for the lab's query
    lab_knock_text = "edit-lab-knock-text"
    lab_knock_clear = "edit-lab-knock-clear"
    lab_continuation = "edit-lab-continuation"
    lab_result = "edit-lab-result"
    lab_predictions = "edit-lab-predictions"
    lab_row = "edit-lab-row"
    coref_candidate = "edit-coref-candidate"
    coref_top = "edit-coref-top"
    coref_continuation = "edit-coref-continuation"
    coref_test = "edit-coref-test"
    coref_result = "edit-coref-result"
    coref_predictions = "edit-coref-predictions"
    importance_run = "importance-run"
    importance_cancel = "importance-cancel"
    importance_progress = "importance-progress"
    importance_progress_text = "importance-progress-text"
    importance_note = "importance-note"
    importance_map = "importance-map"


class IID:
    """The Image tab (image_view): a picture uploaded, captured by a vision model, a patch clicked."""

    intro = "image-intro"  # what the tab does and needs
    upload = "image-upload"
    sample = "image-sample"
    layer = "image-layer"
    head = "image-head"
    message = "image-message"
    store = "image-store"  # dcc.Store: the server's key of the picture's capture, and its model
    provenance_json = "image-provenance"  # hidden: the picture's capture's provenance as JSON (figure_image.js)
    query = "image-query"  # dcc.Store: the clicked patch [row, col], or None for the first query
    graph = "image-graph"
    mode = "image-mode"  # one head (or the heads' mean), every head as thumbnails, or the rollout
    switches = "image-switches"  # the AttentionLab's switches for one head's row: causal mask, ÷√d_k
    # a model of two towers (towers): a LLaVA-style VLM, a joint CLIP / SigLIP
    towers = "image-towers"  # the row of the prompt, the part and the word: shown for a model of two towers
    prompt = "image-prompt"  # the text read with the picture (a VLM's with its <image>)
    part = "image-part"  # which tower: a VLM's language model or vision tower, a joint model's text or vision tower
    word = "image-word"  # the prompt's token whose row is drawn (a VLM's language model, a joint text tower)
    strip = "image-strip"  # the same row over the text's tokens, beside the picture
    # a VLM's "Continue the text" with the picture (attnviz.generate): its row, how many, the button, what it wrote
    continue_box = "image-continue"  # shown for a vision-language model only
    new_tokens = "image-new-tokens"
    generate = "image-generate"
    generated = "image-generated"
    note = "image-note"  # what the page reads differently from a model's own processor (Idefics3's tiles)
