#!/usr/bin/env python3
"""Write two tiny GGUF llama models (a target and its draft) that the real llama.cpp servers load.

    python tests/real/make_models.py DIR        # prints the two paths
    from make_models import make_models; target, draft = make_models(DIR)

Only `gguf` and numpy, no downloads, deterministic (fixed seeds), a few MB each, about a second.

What the models are:
- A byte-level BPE tokenizer in GPT-2's form (tokenizer model "gpt2", pre-tokenizer "gpt-2"): the 256
  bytes in GPT-2's byte-to-unicode mapping, plus merges learnt here from the short text below (code,
  English, Chinese, Japanese). No merge may complete a non-ASCII character, so every CJK character is
  split into two or three tokens and partial-UTF-8 tokens occur in prompts and in generated text.
  Control tokens <s> (BOS, added to every prompt), </s> (EOS), <|im_start|>, <|im_end|>; a ChatML
  chat template.
- A bigram model: one transformer block whose attention and feed-forward outputs are zero (so the
  block adds nothing), hence logits = output.weight · rmsnorm(token_embd[last token]). The logit table
  is fitted from bigram counts on the text (smoothed), with its argmax forced to a chosen successor
  with a margin of at least MARGIN nats, so the greedy choice never hangs on rounding differences
  between the servers' batched and one-token kernels. The table is stored exactly: output.weight is
  c·I (vocab × embedding, embedding >= vocab + 1), token_embd rows are the table rows / c, and one
  extra embedding dimension pads each row's RMS to exactly 1 so rmsnorm leaves it unchanged.
- Greedy text follows the text's own bigrams; every greedy path ends with EOS (each cycle of the
  successor function is cut at one point), so chat without max_tokens stops by itself.
- The draft is the same table with noise added and, for a share of the rows, a different successor
  (another follower seen in the text): the pair agrees often but not always.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import sys
from collections import Counter, defaultdict

import numpy as np

__all__ = ["make_models", "make_compute_models", "CHAT_TEMPLATE", "SPECIAL_TOKENS", "model_dir"]

TEXT = r'''
def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


def read_lines(path):
    with open(path, "r", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value

    def reset(self):
        self.value = 0


def merge_sort(items):
    if len(items) <= 1:
        return items
    middle = len(items) // 2
    left = merge_sort(items[:middle])
    right = merge_sort(items[middle:])
    result = []
    while left and right:
        if left[0] <= right[0]:
            result.append(left.pop(0))
        else:
            result.append(right.pop(0))
    return result + left + right


for i in range(10):
    print(i, fibonacci(i))

numbers = [3, 1, 4, 1, 5, 9, 2, 6]
print(sorted(numbers))
print(merge_sort(numbers))

def parse_config(text):
    settings = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        settings[key.strip()] = value.strip()
    return settings


async def fetch_all(client, urls):
    results = {}
    for url in urls:
        response = await client.get(url, timeout=10)
        response.raise_for_status()
        results[url] = response.json()
    return results


if __name__ == "__main__":
    config = parse_config(open("settings.ini").read())
    print(config.get("name", "unknown"))

The quick brown fox jumps over the lazy dog. The model reads the prompt and writes the answer one
token at a time. A small draft model proposes the next tokens, and the large target model checks
them all at once. When the draft is right, the answer comes faster; when it is wrong, the target
corrects it and the draft tries again. The output is always the target's own text.
We test the server with short prompts and long prompts, with code and with text in other languages.
Speculative decoding keeps the output exactly the same as the target would write it alone, because
every token is checked before it is shown. A server that reports the probability of each token lets
the client check many tokens in one request. If the prompt is long, every request sends it again, and
the cost of each round grows with the length of the context.

今天天气很好，我们去公园散步。我喜欢学习中文，也喜欢写程序。这个模型很小，但是它可以生成文字。
中文的每个字在字节级的分词器里会被分成几个部分。我们用这个模型测试服务器的输出是否一致。
北京是中国的首都。上海是一个很大的城市。我们明天去上海看朋友。
小明每天早上七点起床，先喝一杯水，然后去学校上课。他最喜欢的课是数学和音乐。
这个程序读取一个文件，然后把每一行的数字加起来，最后打印结果。如果文件不存在，程序会报错。

今日はいい天気ですね。私は日本語を勉強しています。このモデルはとても小さいですが、文章を書くことができます。
東京は日本の首都です。明日は友達と一緒に京都へ行きます。プログラムを書くのは楽しいです。
この関数は二つの数を足して、その結果を返します。ファイルが見つからない場合は、エラーを表示します。
春になると桜が咲いて、たくさんの人が公園に集まります。

<|im_start|>user
Write a function that adds two numbers.<|im_end|>
<|im_start|>assistant
def add(a, b):
    return a + b<|im_end|>
<|im_start|>user
你好，请介绍一下你自己。<|im_end|>
<|im_start|>assistant
你好！我是一个很小的模型，我可以写程序，也可以说中文。<|im_end|>
<|im_start|>user
日本語で答えてください。<|im_end|>
<|im_start|>assistant
はい、日本語で答えます。今日はいい天気です。<|im_end|>
'''

SPECIAL_TOKENS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
BOS, EOS, IM_START, IM_END = SPECIAL_TOKENS

#: ChatML. llama-server continues a trailing assistant message itself (it renders the conversation
#: before it with the generation prompt, then appends the message's text), so the template needs no
#: special case; rendering a trailing assistant message without its end tag lets Jinja-side
#: continuation (llama-cpp-python, transformers' continue_final_message) work too.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] -}}"
    "{%- if not (loop.last and message['role'] == 'assistant') -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

NUM_MERGES = 600  # vocabulary: 256 bytes + merges + 4 control tokens <= EMBEDDING - 1
EMBEDDING = 768
HEADS = 2
HEAD_DIM = 32
FFN = 32
CHAT_REPLY = 100  # tokens of the greedy chat reply before EOS (at least)
MARGIN = 0.75  # nats between each row's argmax and its runner-up, in both models
DRAFT_NOISE = 0.8  # std of the noise added to the draft's table (nats)
DRAFT_DISAGREE = 0.25  # share of rows (with another follower to choose) whose draft argmax differs
SEED = 20261130

# GPT-2's pre-tokenizer regex, with Python's `re` (no \p{L}): letters are [^\W\d_].
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _completes_a_character(data: bytes) -> bool:
    """Whether `data` holds a whole multi-byte UTF-8 character (lead byte and all its continuations)."""
    for i, byte in enumerate(data):
        need = 1 if 0xC0 <= byte < 0xE0 else 2 if 0xE0 <= byte < 0xF0 else 3 if byte >= 0xF0 else 0
        if need and i + need < len(data) and all(0x80 <= b < 0xC0 for b in data[i + 1 : i + 1 + need]):
            return True
    return False


def _words(text: str) -> list[bytes]:
    return [w.encode("utf-8") for w in _PRETOKENIZE.findall(text)]


def learn_merges(text: str, num_merges: int) -> list[tuple[bytes, bytes]]:
    plain = _SPECIAL_SPLIT.sub("\n", text)
    freq = Counter(_words(plain))
    words = {w: [bytes([b]) for b in w] for w in freq}
    merges: list[tuple[bytes, bytes]] = []
    banned: set[tuple[bytes, bytes]] = set()
    while len(merges) < num_merges:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for w, parts in words.items():
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += freq[w]
        candidates = [(count, pair) for pair, count in pairs.items() if count >= 2 and pair not in banned]
        if not candidates:
            break
        count, best = max(candidates, key=lambda item: (item[0], item[1]))
        if _completes_a_character(best[0] + best[1]):
            banned.add(best)
            continue
        merges.append(best)
        joined = best[0] + best[1]
        for w, parts in words.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == best[0] and parts[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            words[w] = out
    return merges


def bpe(word: bytes, ranks: dict[tuple[bytes, bytes], int]) -> list[bytes]:
    parts = [bytes([b]) for b in word]
    while len(parts) > 1:
        ranked = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(ranked)
        if rank == 1 << 30:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


class Vocab:
    def __init__(self, merges: list[tuple[bytes, bytes]]) -> None:
        self.merges = merges
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.pieces: list[bytes] = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
        self.special = {s: len(self.pieces) + i for i, s in enumerate(SPECIAL_TOKENS)}
        self.size = len(self.pieces) + len(SPECIAL_TOKENS)
        self.index = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_SPLIT.split(text):
            if part in self.special:
                ids.append(self.special[part])
            elif part:
                for word in _words(part):
                    ids.extend(self.index[p] for p in bpe(word, self.ranks))
        return ids

    def piece(self, token: int) -> bytes:
        return self.pieces[token] if token < len(self.pieces) else b""

    def strings(self) -> list[str]:
        table = bytes_to_unicode()
        return ["".join(table[b] for b in p) for p in self.pieces] + list(SPECIAL_TOKENS)

    def merge_strings(self) -> list[str]:
        table = bytes_to_unicode()
        return [" ".join("".join(table[b] for b in x) for x in pair) for pair in self.merges]


def _ends_on_character_boundary(piece: bytes) -> bool:
    """Whether the token's last byte closes a character (ASCII, or the end of a whole multi-byte one)."""
    if not piece or piece[-1] < 0x80:
        return True
    for i in range(len(piece) - 1, -1, -1):
        byte = piece[i]
        if byte >= 0xC0:
            need = 1 if byte < 0xE0 else 2 if byte < 0xF0 else 3
            return len(piece) - 1 - i == need
    return False  # continuation bytes only: whether they close a character depends on what came before


def _cycles(successor: np.ndarray, stop: int) -> list[list[int]]:
    seen: dict[int, int] = {}
    found = []
    for start in range(len(successor)):
        if start in seen or start == stop:
            continue
        path, t = [], start
        while t not in seen and t != stop:
            seen[t] = start
            path.append(t)
            t = int(successor[t])
        if t != stop and seen.get(t) == start:
            found.append(path[path.index(t) :])
    return found


def _utf8_step(pending: int, piece: bytes) -> int | None:
    """Continuation bytes still owed after `piece`, if `pending` were owed before it (None: invalid)."""
    for byte in piece:
        if pending:
            if not 0x80 <= byte < 0xC0:
                return None
            pending -= 1
        elif byte < 0x80:
            continue
        elif 0xC2 <= byte < 0xF5:
            pending = 1 if byte < 0xE0 else 2 if byte < 0xF0 else 3
        else:
            return None
    return pending


def _successors(V: int, followers: dict[int, list[int]], pieces: list[bytes], entry: dict[int, int], start: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """The greedy successor of each token, and the walk it follows.

    A long walk through the text's bigrams (so greedy text reads like the text, and varies for a long
    time), found with Warnsdorff's rule from `start`, jumping to an unvisited token where it is stuck;
    it closes into one cycle, and every token off the walk leads onto it. Every step keeps UTF-8
    whole: each token is assumed to follow what usually precedes it in the text (`entry`: continuation
    bytes owed before it), and a step a -> b is taken only if a leaves owed what b expects."""

    def piece(t: int) -> bytes:
        return pieces[t] if t < len(pieces) else b""

    def leaves(t: int) -> int | None:
        return _utf8_step(entry.get(t, 0), piece(t))

    def fits(a: int, b: int) -> bool:
        owed = leaves(a)
        return owed is not None and entry.get(b, 0) == owed and leaves(b) is not None

    in_text = sorted({o for options in followers.values() for o in options} | {start})
    best: list[int] = []
    for _ in range(8):
        path, seen, t = [start], {start}, start
        while True:
            options = [o for o in followers[t] if o not in seen and fits(t, o)]
            if not options:
                # Stuck: jump to an unvisited token of the text that fits, with the most ways on.
                options = [o for o in in_text if o not in seen and fits(t, o)]
            if not options:
                break
            onward = {o: sum(1 for x in followers[o] if x not in seen and x != o) for o in options}
            alive = [o for o in options if onward[o] > 0] or options
            t = min(alive, key=lambda o: (onward[o], rng.random()))
            path.append(t)
            seen.add(t)
        if len(path) > len(best):
            best = path
    succ = np.full(V, -1, dtype=int)
    for a, b in zip(best, best[1:]):
        succ[a] = b
    position = {t: i for i, t in enumerate(best)}
    last = best[-1]
    back = [o for o in best if fits(last, o)]
    succ[last] = start if fits(last, start) or not back else back[0]
    for t in range(V):
        if succ[t] >= 0:
            continue
        onto = [o for o in followers[t] if o in position and fits(t, o)] or [o for o in best if fits(t, o)]
        succ[t] = onto[0] if onto else followers[t][0] if followers[t] else start
    return succ, best


def _tables(vocab: Vocab) -> tuple[np.ndarray, np.ndarray, dict]:
    """The target's and the draft's logit tables (vocab × vocab) and a few figures about them."""
    rng = np.random.default_rng(SEED)
    V = vocab.size
    bos, eos, im_start, im_end = (vocab.special[s] for s in SPECIAL_TOKENS)
    sequences = []
    for paragraph in re.split(r"\n\s*\n(?=\S)", TEXT.strip("\n")):
        sequences.append([bos] + vocab.encode(paragraph))
    counts = np.zeros((V, V))
    owed_before: dict[int, Counter[int]] = defaultdict(Counter)
    for seq in sequences:
        owed = 0
        for a, b in zip(seq, seq[1:]):
            counts[a, b] += 1
        for t in seq:
            owed_before[t][owed] += 1
            owed = _utf8_step(owed, vocab.piece(t)) or 0
    entry = {t: c.most_common(1)[0][0] for t, c in owed_before.items()}
    unigram = counts.sum(axis=0) + 0.05
    for s in (bos, im_start, im_end, eos):
        unigram[s] = 0.0
    unigram /= unigram.sum()
    alpha = 1.5
    row_totals = counts.sum(axis=1, keepdims=True)
    probs = (counts + alpha * unigram) / (row_totals + alpha)
    table = np.log(np.maximum(probs, 1e-12))
    # Control tokens are never generated; EOS only where a greedy path is cut (below), else unlikely.
    table[:, [bos, im_start, im_end]] = -30.0
    table[:, eos] = np.log(1e-4)

    followers = {t: [int(j) for j in np.argsort(-counts[t], kind="stable") if counts[t, j] > 0 and j not in (bos, im_start, im_end, eos)] for t in range(V)}
    newline = vocab.encode("\n")[0]  # where chat replies start: "<|im_start|>assistant\n"
    succ, walk = _successors(V, followers, vocab.pieces, entry, newline, rng)
    for s in (bos, im_start, im_end):
        succ[s] = int(np.argmax(counts[s])) if counts[s].sum() else newline
    succ[eos] = eos  # never reached: generation stops at EOS

    # Cut every cycle of the greedy successor function once, with EOS after a token that closes a
    # character: the long cycle CHAT_REPLY tokens after "\n" (chat replies end by themselves), the
    # short ones after their least frequent token.
    chain, t = [], newline
    while t not in chain and t != eos:
        chain.append(t)
        t = int(succ[t])
    entry = chain.index(t) if t in chain else len(chain)
    closing = [i for i in range(max(entry, CHAT_REPLY), len(chain)) if _ends_on_character_boundary(vocab.piece(chain[i]))]
    if t != eos:
        succ[chain[closing[0] if closing else len(chain) - 1]] = eos
    for cycle in _cycles(succ, eos):
        closing = [t for t in cycle if _ends_on_character_boundary(vocab.piece(t))] or cycle
        cut = min(closing, key=lambda t: (counts[:, t].sum(), t))
        succ[cut] = eos

    def force(tab: np.ndarray, successor: np.ndarray) -> np.ndarray:
        tab = tab.copy()
        for t in range(V):
            s = int(successor[t])
            others = np.delete(tab[t], s)
            tab[t, s] = max(tab[t, s], others.max() + MARGIN)
        return tab

    target = force(table, succ)

    word_starts = sorted({int(s) for s in range(len(vocab.pieces)) if vocab.piece(s)[:1] == b" " and vocab.piece(s)[1:2].isalpha() and counts[:, s].sum() >= 2})
    draft_succ = succ.copy()
    disagree = 0
    for t in range(V):
        options = [o for o in followers[t] if o != succ[t]]
        if not options and _ends_on_character_boundary(vocab.piece(t)):
            options = [o for o in word_starts if o != succ[t]]
        if succ[t] != eos and options and rng.random() < DRAFT_DISAGREE:
            draft_succ[t] = options[int(rng.integers(len(options)))]
            disagree += 1
    noisy = table + rng.normal(0.0, DRAFT_NOISE, size=table.shape)
    noisy[:, [bos, im_start, im_end]] = -30.0
    draft = force(noisy, draft_succ)

    lengths = []
    for start in range(V):
        t, n = start, 0
        while t != eos and n < 10 * V:
            t, n = int(succ[t]), n + 1
        lengths.append(n)
    samples = {}
    for prompt in ("def fibonacci(n):", "今天天气", "今日は", "The model", "<|im_start|>assistant\n"):
        ids = vocab.encode(prompt)
        out = []
        t = ids[-1]
        while len(out) < 64 and succ[t] != eos:
            t = int(succ[t])
            out.append(t)
        samples[prompt] = b"".join(vocab.piece(i) for i in out).decode("utf-8", "replace")
    on_walk = [t for t in walk if succ[t] != eos]
    figures = {
        "walk": len(walk),
        "walk_agreement": float(np.mean([draft_succ[t] == succ[t] for t in on_walk])),
        "greedy_samples": samples,
        "rows_disagreeing": disagree / V,
        "greedy_path_mean": float(np.mean(lengths)),
        "greedy_path_max": float(np.max(lengths)),
    }
    return target, draft, figures


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model's layers. The bigram table lives in the embedding and output layers; the blocks only
    cost compute: their writes into the residual stream (attn_output, ffn_down) are zero, or random
    with `write_std` small enough that no logit moves by more than a small fraction of MARGIN."""

    embedding: int = EMBEDDING
    blocks: int = 1
    heads: int = HEADS
    kv_heads: int = HEADS
    head_dim: int = HEAD_DIM
    ffn: int = FFN
    write_std: float = 0.0


TINY = Shape()
#: The compute-bound target: the tiny target's bigram table, behind blocks that cost real matrix work
#: (about 190 MB of F32 weights, far more than the caches, so a decode step is bound by memory like a
#: GPU server's, and scoring a few tokens in one batch costs little more than one).
COMPUTE = Shape(embedding=1024, blocks=4, heads=16, kv_heads=4, head_dim=64, ffn=2816, write_std=1e-4)
#: Its draft: the tiny draft's table behind one small block (about 9 MB, within the caches).
COMPUTE_DRAFT = Shape(embedding=1024, blocks=1, heads=2, kv_heads=2, head_dim=64, ffn=256, write_std=1e-4)


def _write(path: pathlib.Path, name: str, vocab: Vocab, table: np.ndarray, shape: Shape = TINY) -> None:
    import gguf

    V, width = vocab.size, shape.embedding
    assert V <= width - 1, (V, width)
    centred = table - table.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=1))
    scale = float(norms.max() / np.sqrt(0.9 * width))
    embd = np.zeros((V, width), dtype=np.float64)
    embd[:, :V] = centred / scale
    embd[:, width - 1] = np.sqrt(width - (embd[:, : width - 1] ** 2).sum(axis=1))  # RMS exactly 1
    output = np.zeros((V, width), dtype=np.float64)
    output[np.arange(V), np.arange(V)] = scale

    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(4096)
    writer.add_embedding_length(width)
    writer.add_block_count(shape.blocks)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(V)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.strings())
    writer.add_token_types([gguf.TokenType.NORMAL] * len(vocab.pieces) + [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS))
    writer.add_token_merges(vocab.merge_strings())
    writer.add_bos_token_id(vocab.special[BOS])
    writer.add_eos_token_id(vocab.special[EOS])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    f32 = np.float32
    writer.add_tensor("token_embd.weight", embd.astype(f32))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=f32))
    writer.add_tensor("output.weight", output.astype(f32))
    rng = np.random.default_rng(SEED + 1)
    inner, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def normal(std: float, rows: int, cols: int) -> np.ndarray:
        if std == 0.0:
            return np.zeros((rows, cols), dtype=f32)
        return rng.standard_normal((rows, cols), dtype=f32) * f32(std)

    for block in range(shape.blocks):
        blk = f"blk.{block}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(width, dtype=f32))
        writer.add_tensor(blk + "attn_q.weight", normal(0.02, inner, width))
        writer.add_tensor(blk + "attn_k.weight", normal(0.02, kv, width))
        writer.add_tensor(blk + "attn_v.weight", normal(0.02, kv, width))
        writer.add_tensor(blk + "attn_output.weight", normal(shape.write_std, width, inner))
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(width, dtype=f32))
        writer.add_tensor(blk + "ffn_gate.weight", normal(0.02, shape.ffn, width))
        writer.add_tensor(blk + "ffn_up.weight", normal(0.02, shape.ffn, width))
        writer.add_tensor(blk + "ffn_down.weight", normal(shape.write_std, width, shape.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def fingerprint() -> str:
    """A hash of this script: the models are rebuilt when it changes."""
    return hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]


def model_dir() -> pathlib.Path:
    """Where the models are cached: next to the built servers, keyed by this script's hash."""
    base = os.environ.get("SPECAPI_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specapi", "models"
    )
    return pathlib.Path(base) / fingerprint()


def build(directory: str | os.PathLike[str]) -> tuple[pathlib.Path, pathlib.Path, dict]:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = Vocab(learn_merges(TEXT, NUM_MERGES))
    target_table, draft_table, figures = _tables(vocab)
    target, draft = directory / "tiny-target.gguf", directory / "tiny-draft.gguf"
    _write(target, "specapi-tiny-target", vocab, target_table)
    _write(draft, "specapi-tiny-draft", vocab, draft_table)
    figures["vocab"] = vocab.size
    return target, draft, figures


def make_compute_models(directory: str | os.PathLike[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """The compute-bound target and its draft (GGUF paths in `directory`, default the cache), written
    if missing. They carry the tiny target's and the tiny draft's tables (the same vocabulary, the same
    greedy agreement), behind blocks of the COMPUTE and COMPUTE_DRAFT shapes."""
    directory = pathlib.Path(directory) if directory is not None else model_dir()
    target, draft = directory / "compute-target.gguf", directory / "compute-draft.gguf"
    if not (target.exists() and draft.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        vocab = Vocab(learn_merges(TEXT, NUM_MERGES))
        target_table, draft_table, _ = _tables(vocab)
        _write(target, "specapi-compute-target", vocab, target_table, COMPUTE)
        _write(draft, "specapi-compute-draft", vocab, draft_table, COMPUTE_DRAFT)
    return target, draft


def make_models(directory: str | os.PathLike[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """The target and draft GGUF paths in `directory` (default: the cache), written if missing."""
    directory = pathlib.Path(directory) if directory is not None else model_dir()
    target, draft = directory / "tiny-target.gguf", directory / "tiny-draft.gguf"
    if not (target.exists() and draft.exists()):
        target, draft, _ = build(directory)
    return target, draft


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else str(model_dir())
    t, d, figs = build(out)
    print(figs, file=sys.stderr)
    print(t)
    print(d)
