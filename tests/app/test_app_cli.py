from __future__ import annotations

import socket
import subprocess
import sys

from crossover.app.cli import PAGE_SCRIPT, streamlit_command
from crossover.cli import build_parser
from tests.app.app_fixtures import spec_file_on_free_ports
from tests.app.app_process import running_app


def crossover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crossover", "app", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_command_passes_the_page_arguments_through(tmp_path):
    _, spec = spec_file_on_free_ports(tmp_path)
    args = build_parser().parse_args(["app", str(spec), "--port", "8555", "--results", str(tmp_path / "r"),
                                      "--exporter", "http://127.0.0.1:9400"])
    command = streamlit_command(args)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4] == str(PAGE_SCRIPT)
    assert command[command.index("--server.port") + 1] == "8555"
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    page_args = command[command.index("--") + 1:]
    assert page_args == [str(spec), "--results", str(tmp_path / "r"), "--exporter", "http://127.0.0.1:9400"]


def test_a_bad_spec_is_one_line_and_exit_2_without_starting_streamlit(tmp_path):
    result = crossover(str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"crossover app: {tmp_path / 'nope.yaml'}: no such file"


def test_bad_flags_are_one_line(tmp_path):
    _, spec = spec_file_on_free_ports(tmp_path)
    result = crossover(str(spec), "--prometheus", "localhost:9090")
    assert result.returncode == 2
    assert result.stderr.strip() == "crossover app: --prometheus: malformed URL 'localhost:9090' " \
                                    "(want http://host:port)"
    blocked = tmp_path / "results"
    blocked.write_text("a file")
    result = crossover(str(spec), "--results", str(blocked))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"crossover app: --results {blocked}: cannot create the folder "
                                     "(File exists)")
    result = crossover(str(spec), "--port", "70000")
    assert result.returncode == 2 and "--port" in result.stderr and "Traceback" not in result.stderr


def test_a_port_in_use_or_a_bad_address_is_one_line(tmp_path):
    _, spec = spec_file_on_free_ports(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = crossover(str(spec), "--port", str(port), "--results", str(tmp_path / "r"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"crossover app: --address 127.0.0.1 --port {port}: cannot listen "
                                     "there (Address already in use)")
    result = crossover(str(spec), "--address", "no-such-host.invalid", "--results", str(tmp_path / "r"))
    assert result.returncode == 2
    assert result.stderr.startswith("crossover app: --address no-such-host.invalid --port 8501: "
                                    "cannot listen")
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_app_serves_on_the_given_port(tmp_path):
    _, spec = spec_file_on_free_ports(tmp_path)
    with running_app(spec, tmp_path / "results", tmp_path / "app.log") as url:
        assert url.startswith("http://127.0.0.1:")
    assert (tmp_path / "results").is_dir()
