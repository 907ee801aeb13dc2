"""The Streamlit page: a thin layout over the pure modules next to it.

Sidebar: the sweep form (topologies, load, lengths, SLOs) with Start/Stop, and past runs.
Main: the sweep's status, the crossover sentences, the charts against load, the server-side view,
the results table and the downloads. While a sweep runs, the main area is a fragment that reruns
every second; the sweep itself runs in a thread owned by a SweepRunner shared by every browser
session of this app (one fleet, one sweep at a time: two sweeps at once would skew each other).
Every error reaches the page as st.error with one line, never as a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from crossover.app import capacity_view, charts, form, runs, serverview, view
from crossover.app.config import AppConfig, parse_page_args
from crossover.app.preflight import unreachable_targets
from crossover.app.runner import RunState, RunStatus, SweepRunner, in_child_process, jobs_in, sweep_spec_plan
from crossover.errors import UserError
from crossover.loadgen.analysis.adaptive import adaptive_line
from crossover.loadgen.analysis.analyze import import_bench_run
from crossover.loadgen.analysis.results import RUN_FILE, load_run
from crossover.loadgen.analysis.summary import level_warnings
from crossover.loadgen.plan import Endpoint, Mode
from crossover.slo import SLO_KINDS
from crossover.spec import REQUEST_SOURCES, FleetSpec, load_spec

REFRESH_S = 1.0
LIVE = "live"


@st.cache_resource(show_spinner=False)
def shared_runner(spec_path: str, results_dir: str) -> SweepRunner:
    """One runner per (spec, results folder), shared by every session of this server."""
    return SweepRunner()


@st.cache_resource(show_spinner=False)
def shared_poller(source: str, url: str, spec_path: str) -> serverview.ServerPoller:
    poller = serverview.ServerPoller(source, url, load_spec(spec_path))
    poller.start()
    return poller


@st.cache_resource(show_spinner=False, max_entries=4)  # read-only once built; no copy per rerun
def open_past_run(path: str, modified: float, bench: bool, spec_path: str) -> view.ResultsView:
    """A run folder as a view; `modified` makes a run that changed (one still running) a new entry.
    A folder of vllm bench serve result files (`bench`) is imported with the spec's SLOs and GPUs."""
    if bench:
        spec = load_spec(spec_path)
        return view.past_view(import_bench_run([path], spec.slos.thresholds_ms, spec.slos.objective,
                                               spec=spec))
    return view.past_view(load_run(path))


def form_from_state(state: Any, spec: FleetSpec) -> form.SweepForm:
    """The sweep form as the widgets hold it now (callbacks run before the widgets are drawn)."""
    defaults = form.default_form(spec)
    return form.SweepForm(
        topologies=list(state.get("topologies", defaults.topologies)),
        mode=str(state.get("mode", defaults.mode)), levels=str(state.get("levels", defaults.levels)),
        requests_per_level=int(state.get("requests_per_level", defaults.requests_per_level)),
        input_len=str(state.get("input_len", defaults.input_len)),
        output_len=str(state.get("output_len", defaults.output_len)),
        seed=int(state.get("seed", defaults.seed)),
        endpoint=str(state.get("endpoint", defaults.endpoint)),
        turns=int(state.get("turns", defaults.turns)),
        slos_ms={name: state.get(f"slo_{name}", defaults.slos_ms.get(name)) for name in SLO_KINDS},
        objective=float(state.get("objective", defaults.objective)),
        bootstrap=int(state.get("bootstrap", defaults.bootstrap)),
        adaptive=bool(state.get("adaptive", defaults.adaptive)),
        target_ci=float(state.get("target_ci", defaults.target_ci)))


def sidebar_form(spec: FleetSpec, runner: SweepRunner, config: AppConfig, active: bool) -> None:
    """The sweep form; Start and Stop act in callbacks, so the page drawn after shows their effect."""
    defaults = form.default_form(spec)
    sb = st.sidebar
    sb.header("Sweep")
    sb.multiselect("Topologies", [t.name for t in spec.topologies], default=defaults.topologies,
                   key="topologies", help="each gets the same seeded requests at every level")
    mode = sb.radio("Load", [Mode.CLOSED.value, Mode.OPEN.value], horizontal=True, key="mode",
                    format_func=lambda m: "closed loop (concurrency)" if m == "closed"
                    else "open loop (req/s)")
    sb.text_input("Concurrency levels" if mode == Mode.CLOSED.value else "Request rates (req/s)",
                  value=defaults.levels, key="levels", help="comma-separated, e.g. 1,2,4,8,16")
    sb.checkbox("Adaptive levels", value=defaults.adaptive, key="adaptive",
                help="the levels are the range: start at its low end and middle, then add levels where the "
                     "crossing or a capacity is least sure, until its interval is narrower than the target")
    if st.session_state.get("adaptive", defaults.adaptive):
        sb.number_input("Target interval width (share of the estimate)", min_value=0.01, max_value=0.99,
                        value=defaults.target_ci, step=0.01, format="%.2f", key="target_ci")
    sb.number_input("Requests per level", min_value=1, max_value=form.MAX_REQUESTS_PER_LEVEL,
                    value=defaults.requests_per_level, step=1, key="requests_per_level")
    left, right = sb.columns(2)
    left.text_input("Input tokens", value=defaults.input_len, key="input_len",
                    help="N, uniform:LOW-HIGH or normal:MEAN,STD")
    right.text_input("Output tokens", value=defaults.output_len, key="output_len",
                     help="N, uniform:LOW-HIGH or normal:MEAN,STD")
    sb.number_input("Seed", min_value=0, value=defaults.seed, step=1, key="seed")
    sb.radio("Endpoint", [e.value for e in Endpoint], horizontal=True, key="endpoint",
             help="/v1/completions (prompts as token ids) or /v1/chat/completions; lengths are counted "
                  "with the server's /tokenize")
    sb.number_input("Turns per conversation (chat)", min_value=1, max_value=form.MAX_TURNS,
                    value=defaults.turns, step=1, key="turns",
                    help="each turn sends the history, the previous answer and a new message of the input "
                    "length; TTFT and ITL per turn appear below the results")
    with sb.expander("SLOs (from the spec; 0 switches one off)", expanded=False):
        for name in SLO_KINDS:
            st.number_input(f"{form.SLO_LABELS[name]} (ms)", min_value=0.0,
                            value=float(defaults.slos_ms.get(name) or 0.0), step=10.0, key=f"slo_{name}")
        st.number_input("Objective (share of good requests)", min_value=0.0, max_value=1.0,
                        value=defaults.objective, step=0.005, format="%.3f", key="objective")
    with sb.expander("Advanced", expanded=False):
        # the bootstrap runs after every level on the sweep's thread: fewer resamples, faster levels
        st.number_input("Bootstrap resamples (crossover interval; 0: none)", min_value=0,
                        max_value=form.MAX_BOOTSTRAP, value=defaults.bootstrap, step=50, key="bootstrap")
    left, right = sb.columns(2)
    left.button("Start sweep", type="primary", disabled=active, key="start", width="stretch",
                on_click=on_start, args=(runner, spec, config))
    right.button("Stop", disabled=not active, key="stop", width="stretch", on_click=runner.stop)


def on_start(runner: SweepRunner, spec: FleetSpec, config: AppConfig) -> None:
    st.session_state["start_error"] = None
    try:
        start_sweep(runner, spec, config, form_from_state(st.session_state, spec))
    except UserError as exc:
        st.session_state["start_error"] = str(exc)


def sidebar_past_runs(config: AppConfig) -> None:
    st.sidebar.header("Past runs")
    past = runs.list_runs(config.results_dir)
    if not past:
        st.sidebar.caption(f"No runs yet in {config.results_dir}")
        return
    labels = {str(run.path): run.label for run in past}
    chosen = st.sidebar.selectbox("Run folder", list(labels), format_func=labels.__getitem__, key="past_run")
    if st.sidebar.button("Open run", key="open_run", width="stretch"):
        st.session_state["view"] = chosen
    if st.session_state.get("view", LIVE) != LIVE and st.sidebar.button("Back to the live sweep",
                                                                          key="back_live", width="stretch"):
        st.session_state["view"] = LIVE


def start_sweep(runner: SweepRunner, spec: FleetSpec, config: AppConfig, values: form.SweepForm) -> None:
    """Check the form and the targets, then start the sweep in the background; UserError otherwise."""
    request = form.build_request(values, spec)
    problems = unreachable_targets(spec, request.topologies)
    if problems:
        raise UserError("; ".join(problems) + ". Start the fleet (e.g. `crossover sim SPEC`) and try again")
    out_dir = runs.new_run_dir(config.results_dir)

    sweep = in_child_process(functools.partial(sweep_spec_plan, spec, request.plan,
                                               list(request.topologies), request.n_boot,
                                               adaptive=request.adaptive))
    runner.start(sweep, out_dir, jobs_in(request.first_levels, request.topologies), axis=request.plan.axis)
    st.session_state["view"] = LIVE


def show_status(status: RunStatus) -> None:
    if status.state is RunState.IDLE:
        return
    done = f"{status.levels_done} of {status.levels_total} (topology, level) steps"
    where = f" into {status.out_dir}" if status.out_dir else ""
    text = {
        RunState.RUNNING: f"Sweep running: {done} done{where}",
        RunState.STOPPING: f"Stopping the sweep after {done}",
        RunState.FINISHED: f"Sweep finished: {done}{where}",
        RunState.STOPPED: f"Sweep stopped by the user after {done}{where}",
        RunState.FAILED: f"Sweep failed after {done}",
    }[status.state]
    st.progress(status.progress, text=text)
    adaptive = status.crossover.adaptive
    if adaptive:
        st.caption(adaptive_line(adaptive, status.axis))
    if status.state is RunState.FAILED and status.error:
        st.error(status.error)


def show_headline(results: view.ResultsView) -> None:
    headlines = view.headline_sentences(results.crossover)
    for sentence in headlines:
        st.success(sentence)
    if not headlines and not results.empty:
        st.info("No goodput crossover yet: the curves have not crossed over the levels measured so far.")
    for line in view.failure_warnings(results.summary) + level_warnings(results.summary):
        st.warning(line)


def show_all_sentences(results: view.ResultsView) -> None:
    crossings = view.crossing_sentences(results.crossover)
    others = view.other_sentences(results.crossover)
    if not crossings and not others:
        return
    with st.expander(f"Every crossing ({len(crossings)}), pairs that do not cross, and capacity at the "
                     "SLO objective"):
        for line in crossings + others:
            st.markdown(f"- {line}")


# Building an altair chart costs tens of milliseconds of CPU, taken from the sweep's own thread
# (one process, one GIL): rebuilt every second it would distort the latencies being measured.
# So each chart's Vega-Lite spec is built once per change of the data it shows.
@st.cache_data(show_spinner=False, max_entries=256)
def metric_spec(data_key: str, metric_key: str, per_gpu: bool, _results: view.ResultsView,
                _gpus: dict[str, int]) -> dict[str, Any]:
    metric = next(m for m in charts.CHART_METRICS if m.key == metric_key)
    frame = charts.chart_frame(_results.summary, metric, _gpus, per_gpu)
    marks = view.crossover_marks(_results.crossover)
    return charts.metric_chart(frame, metric, _results.axis, per_gpu, marks).to_dict(validate=False)


@st.cache_data(show_spinner=False, max_entries=64)
def server_spec(data_key: str, series_key: str, _frame: pd.DataFrame, _marks: pd.DataFrame) -> dict[str, Any]:
    series = next(s for s in serverview.SERIES if s.key == series_key)
    chart = charts.server_chart(_frame, series.key, series.title, series.unit, _marks)
    return chart.to_dict(validate=False)


def show_charts(results: view.ResultsView, gpus: dict[str, int]) -> None:
    per_gpu = st.toggle("Per GPU", key="per_gpu",
                        help="divide throughput and goodput by each topology's GPUs")
    data_key = f"{results.key}:{sorted(gpus.items())}"
    columns = st.columns(3)
    for position, metric in enumerate(charts.CHART_METRICS):
        chart_spec = metric_spec(data_key, metric.key, bool(per_gpu), results, gpus)
        columns[position % 3].vega_lite_chart(spec=chart_spec, width="stretch")


@st.cache_data(show_spinner=False, max_entries=64)
def pareto_spec(data_key: str, _results: view.ResultsView) -> tuple[dict[str, Any] | None, list[str]]:
    found = view.pareto(_results)
    if not found.points:
        return None, []
    return charts.pareto_chart(found).to_dict(validate=False), found.sentences


def show_pareto(results: view.ResultsView) -> None:
    """Tokens/s per GPU against tokens/s per user, once a level has both."""
    chart_spec, sentences = pareto_spec(results.key, results)
    if chart_spec is None:
        return
    st.subheader("Throughput per GPU against interactivity")
    st.vega_lite_chart(spec=chart_spec, width="stretch")
    for line in sentences:
        st.markdown(f"- {line}")


@st.cache_resource(show_spinner=False, max_entries=4)
def open_capacity(path: str, modified: float) -> capacity_view.CapacityView:
    """A `crossover capacity --out` folder; `modified` makes a rewritten one a new entry."""
    return capacity_view.load_capacity(Path(path))


def show_capacity(plan: capacity_view.CapacityView) -> None:
    """A capacity plan: the verdict, the ranked layouts, the crossover map and the Pareto chart."""
    st.caption(f"Showing the capacity plan {plan.source} (predicted on the simulator's ground truth)")
    st.subheader("Which layout")
    st.markdown(plan.verdict)
    if plan.workload:
        st.caption(f"workload: {plan.workload}")
    st.dataframe(plan.ranked, hide_index=True, width="stretch")
    st.subheader(f"Crossover map: the most goodput per GPU at each {plan.axis}")
    st.dataframe(plan.crossover_map, hide_index=True, width="stretch")
    if plan.pareto.points:
        st.subheader("Throughput per GPU against interactivity")
        st.vega_lite_chart(spec=charts.pareto_chart(plan.pareto).to_dict(validate=False), width="stretch")
        for line in plan.pareto.sentences:
            st.markdown(f"- {line}")


def show_table_and_downloads(results: view.ResultsView, downloads: bool) -> None:
    st.subheader("Results")
    st.dataframe(view.summary_table(results.summary), hide_index=True, width="stretch")
    server = view.server_table(results)
    if not server.empty:
        st.caption("The servers' side: their /metrics over each level, as the exporter derives them")
        st.dataframe(server, hide_index=True, width="stretch")
    turns = view.turns_table(results)
    if not turns.empty:
        st.caption("Per turn: a later turn's prompt holds the conversation so far (prefix caching "
                   "shows here)")
        st.dataframe(turns, hide_index=True, width="stretch")
    if not downloads:
        st.caption("Downloads appear when the sweep ends.")
        return
    stem = runs.safe_name(results.out_dir.name if results.out_dir else "sweep")
    columns = st.columns(7)
    position = 0
    for what, get in (("requests", results.requests), ("summary", lambda: results.summary)):
        for fmt in runs.FORMATS:
            columns[position].download_button(
                f"{what}.{fmt}", data=functools.partial(_table_bytes, get, fmt),
                file_name=f"{stem}-{what}.{fmt}", mime=runs.MIME[fmt], key=f"dl_{what}_{fmt}")
            position += 1
    columns[position].download_button("crossover.json", data=runs.json_bytes(results.crossover.to_json()),
                                      file_name=f"{stem}-crossover.json", mime=runs.MIME["json"],
                                      key="dl_crossover")


def _table_bytes(get: Callable[[], pd.DataFrame], fmt: str) -> bytes:
    return runs.table_bytes(get(), fmt)


def show_server_view(config: AppConfig, spec: FleetSpec, status: RunStatus) -> None:
    source = serverview.configured_source(config)
    if source is None:
        return
    st.subheader(f"What the servers saw ({source[0]})")
    poller = shared_poller(source[0], source[1], str(config.spec_path))
    history = poller.history()
    if history.error:
        st.warning(history.error)
    if history.frame.empty:
        st.caption("No server-side data yet.")
        return
    decode_side = serverview.decode_side(history.frame)
    if decode_side:
        st.caption(f"{', '.join(decode_side)}: {REQUEST_SOURCES['decode']} (no entrypoint metrics, so "
                   "request figures come from the decode instances; see docs/routers.md).")
    marks = serverview.level_marks(status.marks)
    data_key = f"{source}:{history.key}:{status.out_dir}:{len(status.marks)}"
    columns = st.columns(2)
    shown = [s for s in serverview.SERIES if s.key in history.frame.columns]
    for position, series in enumerate(shown):
        chart_spec = server_spec(data_key, series.key, history.frame, marks)
        columns[position % 2].vega_lite_chart(spec=chart_spec, width="stretch")


def following(config: AppConfig) -> bool:
    """The page shows the --follow folder and another process is still writing it."""
    return (config.follow is not None and st.session_state.get("view") == str(config.follow)
            and runs.being_written(config.follow))


def results_area(runner: SweepRunner, spec: FleetSpec, config: AppConfig, page_active: bool,
                 was_following: bool = False) -> None:
    status = runner.status()
    if status.state.active != page_active or (was_following and not following(config)):
        # The sidebar was drawn from an older snapshot (a sweep ended or started since): draw the whole
        # page again from one snapshot, so Start and Stop never disagree with the progress bar.
        st.rerun(scope="app")
    show_status(status)
    chosen = st.session_state.get("view", LIVE)
    if config.follow is not None and chosen == str(config.follow) and \
            not (config.follow / RUN_FILE).exists():
        st.info(f"Waiting for the sweep in {config.follow} to start; its curves appear here level by level.")
        return
    try:
        if chosen == LIVE:
            results = view.live_view(status)
        else:
            path = Path(chosen)
            change = runs.last_change(path)
            if change.capacity:
                show_capacity(open_capacity(str(path), change.modified))
                return
            results = open_past_run(str(path), change.modified, change.bench, str(config.spec_path))
            st.caption(f"Showing the past run {path.name}")
    except (UserError, OSError) as exc:
        st.error(f"cannot open that run: {exc}")
        return
    if results.empty and chosen == LIVE and status.state is RunState.IDLE:
        st.info("Pick the topologies, load levels and SLOs in the sidebar, then press Start sweep. "
                "The curves grow as each level finishes.")
    gpus = {t.name: t.gpus for t in spec.topologies}
    show_headline(results)
    show_charts(results, gpus)
    show_pareto(results)
    show_all_sentences(results)
    show_server_view(config, spec, status)
    show_table_and_downloads(results, downloads=not (chosen == LIVE and status.state.active)
                             and not results.empty)


def main() -> None:
    st.set_page_config(page_title="vllm-crossover", layout="wide")
    try:
        config = parse_page_args(sys.argv[1:])
        spec = load_spec(config.spec_path)
    except UserError as exc:
        st.title("vllm-crossover")
        st.error(str(exc))
        return
    st.title(f"vllm-crossover: {spec.model.name} on {spec.hardware.gpu}")
    st.caption(" vs ".join(f"{t.name} ({len(t.instances)} x TP={t.tensor_parallel_size}, {t.gpus} GPUs)"
                           for t in spec.topologies))
    runner = shared_runner(str(config.spec_path.resolve()), str(config.results_dir.resolve()))
    if config.follow is not None and "view" not in st.session_state:
        st.session_state["view"] = str(config.follow)  # opened once; the user may pick another view
    active = runner.status().state.active  # the one read of this run: every widget below agrees with it
    sidebar_form(spec, runner, config, active)
    sidebar_past_runs(config)
    if st.session_state.get("start_error"):
        st.error(st.session_state["start_error"])
    watching = following(config)
    area = st.fragment(run_every=REFRESH_S if active or watching else None)(results_area)
    area(runner, spec, config, active, watching)
