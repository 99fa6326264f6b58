"""Chat data (data/chat.py): which tokens carry loss under real chat templates, truncation by whole
exchanges, packing, errors, the checker's rule and the synthetic set.

Tokenizer folders are made here (a byte-level BPE trained in a fraction of a second, plus a
tokenizer_config.json) around the official templates of Llama 3, Llama 3.1 and Qwen3
(tests/support/chat_templates.py), a ChatML one and a ChatML one with {% generation %} markers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from config.finalize import finalize
from config.hardware import Cluster
from config.registry import DATA_KINDS
from config.rules.data import data as data_rule
from config.schema import DataConfig, ModelConfig, TrainConfig, TrainingConfig
from data.chat import (
    ChatDataError,
    ChatDataset,
    ChatTemplate,
    build_chat_dataset,
    exchanges,
    read_conversations,
)
from data.tokenizer import load_tokenizer
from data.tools.cli import add_data_parser, cmd_data
from data.tools.synthetic_chat import CHATML, write_chat_tokenizer
from tests.support.chat_templates import LLAMA3, LLAMA31, MARKED, QWEN3

LLAMA_TOKENS = (
    "<|end_of_text|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# name: (template, special tokens, eos, bos)
TEMPLATES = {
    "llama3": (LLAMA3, LLAMA_TOKENS, "<|eot_id|>", "<|begin_of_text|>"),
    "llama31": (LLAMA31, LLAMA_TOKENS, "<|eot_id|>", "<|begin_of_text|>"),
    "qwen3": (QWEN3, CHATML_TOKENS, "<|im_end|>", None),
    "chatml": (CHATML, CHATML_TOKENS, "<|im_end|>", None),
    "marked": (MARKED, CHATML_TOKENS, "<|im_end|>", None),
}
SYSTEM = {"role": "system", "content": "you are a careful calculator ."}
CHAT = [
    SYSTEM,
    {"role": "user", "content": "what is 4 plus 5 ?"},
    {"role": "assistant", "content": "4 plus 5 is 9 ."},
    {"role": "user", "content": "and that times 2 ?"},
    {"role": "assistant", "content": "9 times 2 is 18 ."},
]
TEXTS = [m["content"] for m in CHAT] * 20 + ["the quick brown fox counts numbers 0123456789"] * 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_tokenizers")
    return {
        name: write_chat_tokenizer(
            root / name,
            TEXTS,
            template=template,
            special_tokens=specials,
            eos_token=eos,
            bos_token=bos,
            vocab_size=300,
        )
        for name, (template, specials, eos, bos) in TEMPLATES.items()
    }


@pytest.fixture(scope="module")
def templates(folders: dict[str, Path]) -> dict[str, ChatTemplate]:
    return {name: ChatTemplate(load_tokenizer(folder)) for name, folder in folders.items()}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def masked_runs(template: ChatTemplate, messages: list[dict[str, str]]) -> list[str]:
    """The text of every run of consecutive tokens that carries loss."""
    sample = template.encode(messages, "test")
    assert template.backend.decode(sample.ids.tolist()) == template.render(messages)
    runs, run = [], []
    for token, on in zip(sample.ids.tolist(), sample.assistant.tolist(), strict=True):
        if on:
            run.append(token)
        elif run:
            runs.append(template.backend.decode(run))
            run = []
    return runs + ([template.backend.decode(run)] if run else [])


FIRST, SECOND = "4 plus 5 is 9 .", "9 times 2 is 18 ."
EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3 serves the turns after the last user message so


@pytest.mark.parametrize(
    ("name", "end", "think"),
    [
        ("llama3", "<|eot_id|>", ""),
        ("llama31", "<|eot_id|>", ""),
        ("qwen3", "<|im_end|>", EMPTY_THINK),
        ("chatml", "<|im_end|>", ""),
        ("marked", "<|im_end|>", ""),
    ],
)
def test_loss_covers_assistant_content_and_end_of_turn(templates, name, end, think) -> None:
    template = templates[name]
    assert masked_runs(template, CHAT) == [FIRST + end, think + SECOND + end]
    # One exchange without a system message: its answer is the last turn.
    assert masked_runs(template, CHAT[1:3]) == [think + FIRST + end]


def test_which_way_each_template_is_masked(templates) -> None:
    assert templates["marked"].marked and not templates["chatml"].marked
    for name in ("llama3", "llama31", "chatml"):  # they render by appending: prefixes hold
        text = templates[name].render(CHAT)
        assert templates[name]._spans_by_prefix(CHAT, text) is not None
    # Qwen3 writes the first answer without its think block once a user message follows it.
    assert templates["qwen3"]._spans_by_prefix(CHAT, templates["qwen3"].render(CHAT)) is None


def test_qwen3_reasoning_is_learnt_in_the_last_turn_only(templates) -> None:
    thinking = [
        CHAT[1],
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4 plus 5 is 9 ."},
        CHAT[3],
        {"role": "assistant", "content": "<think>\ndouble it\n</think>\n\n9 times 2 is 18 ."},
    ]
    assert masked_runs(templates["qwen3"], thinking) == [
        "4 plus 5 is 9 .<|im_end|>",  # the template drops this turn's reasoning
        "<think>\ndouble it\n</think>\n\n9 times 2 is 18 .<|im_end|>",
    ]


def test_a_template_that_hides_turns_is_refused_by_name(tmp_path: Path) -> None:
    """A template that rewrites earlier turns and drops answers: no boundary holds the answer."""
    hiding = (
        "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}"
        "{{- '<|im_start|>assistant\\n(elided)<|im_end|>\\n' }}{%- else %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    folder = write_chat_tokenizer(
        tmp_path / "hiding", TEXTS, template=hiding, special_tokens=CHATML_TOKENS, vocab_size=300
    )
    with pytest.raises(ChatDataError, match=r"f\.jsonl:3: data.tokenizer=.*hiding.*generation"):
        ChatTemplate(load_tokenizer(folder)).encode(CHAT, "f.jsonl:3")


def dataset(path: Path, folder: Path, *, seq: int, packing: bool = False, **kw) -> ChatDataset:
    return ChatDataset(
        str(path),
        load_tokenizer(folder),
        seq_length=seq,
        num_samples=4,
        packing=packing,
        seed=3,
        **kw,
    )


def test_long_conversations_lose_whole_exchanges_then_are_skipped(
    tmp_path: Path, folders, capsys
) -> None:
    tok = load_tokenizer(folders["chatml"])
    template = ChatTemplate(tok)
    last = [SYSTEM, *CHAT[3:]]
    seq = len(template.encode(last, "x").ids) + 2  # the last exchange and the system one fit
    huge = {"role": "assistant", "content": " ".join(["plus"] * 200)}
    rows = [{"messages": CHAT}, {"messages": [SYSTEM, CHAT[1], huge]}, {"messages": CHAT[:3]}]
    ds = dataset(write_jsonl(tmp_path / "c.jsonl", rows), folders["chatml"], seq=seq)
    assert (ds.truncated, ds.skipped, len(ds.samples)) == (1, 1, 2)
    texts = {tok.detokenize(s.ids.tolist()) for s in ds.samples}
    assert texts == {template.render(last), template.render(CHAT[:3])}
    with pytest.raises(ChatDataError, match="last exchange fits"):
        dataset(write_jsonl(tmp_path / "h.jsonl", rows[1:2]), folders["chatml"], seq=seq)
    cfg = config(str(folders["chatml"]), path=str(tmp_path / "c.jsonl"), seq=seq)
    build_chat_dataset(cfg, tok, num_samples=2)
    assert (
        "1 conversations lost their oldest exchanges and 1 were skipped" in capsys.readouterr().out
    )


SEQ = 256


def test_rows_and_packing_follow_sft(tmp_path: Path, folders) -> None:
    systems = [{"role": "system", "content": f"calculator {i} ."} for i in range(12)]
    rows = [{"messages": [systems[i], *CHAT[1 : 3 + 2 * (i % 2)]]} for i in range(12)]
    path = write_jsonl(tmp_path / "all.jsonl", rows)
    plain = dataset(path, folders["llama31"], seq=SEQ)
    packed = dataset(path, folders["llama31"], seq=SEQ, packing=True)
    assert len(packed.rows) < len(plain.rows) == 12
    row = plain[0]
    sample = plain.samples[int(plain.order[0])]
    n = len(sample.ids) - 1
    assert row["labels"][:n].tolist() == sample.ids[1:].tolist()
    assert row["loss_mask"][:n].tolist() == sample.assistant[1:].astype(float).tolist()
    assert "segment_ids" not in row and all(len(v) == SEQ for v in row.values())
    loss = sum(float(plain[i]["loss_mask"].sum()) for i in range(12))
    assert sum(float(packed[i]["loss_mask"].sum()) for i in range(len(packed.rows))) == loss
    first = packed[0]
    lengths = [len(packed.samples[i].ids) - 1 for i in packed.rows[int(packed.order[0])]]
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    assert [int(first["position_ids"][s]) for s in starts] == [0] * len(starts)
    assert [int(first["segment_ids"][s]) for s in starts] == list(range(len(starts)))
    parts = [
        dataset(path, folders["llama31"], seq=SEQ, split="3,1,0", part=p)
        for p in ("train", "valid")
    ]
    train, valid = ({s.ids.tobytes() for s in d.samples} for d in parts)
    assert len(train) == 9 and len(valid) == 3 and not train & valid


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "not JSON"),
        ('{"prompt": "q", "response": "a"}', "no messages list"),
        ('{"messages": [{"role": "user", "content": 3}]}', "message 0: role and content must be"),
        ('{"messages": [{"role": "user"}]}', "message 0: role and content must be"),
        ('{"messages": ["hi"]}', "message 0 must be an object"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', "role 'tool' is not one of"),
        ('{"messages": [{"role": "user", "content": "q"}]}', "no assistant message"),
        ('{"messages": [{"role": "assistant", "content": "a"}]}', "message 0 must be the user"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]}',
            "system message may only come first",
        ),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ChatDataError, match=words) as err:
        list(read_conversations(path))
    assert f"{path}:3" in str(err.value)


# Loops nested 10^10 iterations deep: minutes of rendering without a bound. The bound counts loop
# steps, so where it stops does not depend on the machine's speed.
ENDLESS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)


def test_a_template_that_loops_for_minutes_is_stopped_and_named(tmp_path: Path) -> None:
    from data.template_limit import TEMPLATE_STEPS

    folder = write_chat_tokenizer(
        tmp_path / "endless",
        TEXTS,
        template=ENDLESS,
        special_tokens=CHATML_TOKENS,
        eos_token="<|im_end|>",
        vocab_size=300,
    )
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    with pytest.raises(ChatDataError) as err:
        dataset(path, folder, seq=64)
    text = str(err.value)
    assert text.startswith(f"{path}:1: data.tokenizer={str(folder)!r}: its chat template")
    assert f"more than {TEMPLATE_STEPS:,} loop steps" in text and "chat_template" in text
    with pytest.raises(ChatDataError, match="loop steps"):  # every rendering is bounded
        load_tokenizer(folder).apply_chat_template(CHAT, tokenize=False)
    # A template of real ones renders as before, again and again, well within the bound.
    normal = load_tokenizer(write_chat_tokenizer(tmp_path / "chatml", TEXTS, vocab_size=300))
    long_chat = [SYSTEM, *CHAT[1:] * 1000]
    assert normal.apply_chat_template(long_chat, tokenize=False).count("<|im_start|>") == 4001


def test_trailing_messages_are_dropped_and_exchanges_split(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": [*CHAT, CHAT[1]]}])
    [(line, messages)] = list(read_conversations(path))
    assert line == 1 and messages == CHAT
    assert exchanges(CHAT) == [CHAT[1:3], CHAT[3:5]]


def config(tokenizer: str, path: str = "/d/chat.jsonl", seq: int = 64) -> TrainingConfig:
    model = ModelConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        seq_length=seq,
        vocab_size=512,
    )
    data = DataConfig(kind="chat", path=path, tokenizer=tokenizer, split="1,0,0")
    return TrainingConfig(name="t", model=model, train=TrainConfig(global_batch_size=2), data=data)


def checked(tokenizer: str) -> list:
    cfg, cluster = config(tokenizer), Cluster(num_nodes=1, gpus_per_node=1, gpu="h100")
    return data_rule(cfg, cluster, finalize(cfg, cluster))


def test_checker_wants_a_folder_with_a_chat_template(tmp_path: Path, folders) -> None:
    assert DATA_KINDS["chat"].needs_chat_template and DATA_KINDS["chat"].packs
    assert checked(str(folders["qwen3"])) == []
    bare = write_chat_tokenizer(tmp_path / "bare", TEXTS, vocab_size=300)
    settings = json.loads((bare / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(settings))
    [problem] = checked(str(bare))
    assert problem.field == "data.tokenizer" and "has no chat template" in problem.message
    assert str(bare) in problem.message
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTemplate(load_tokenizer(bare))
    (bare / "chat_template.jinja").write_text(CHATML)  # where transformers saves it today
    assert checked(str(bare)) == []
    [problem] = checked(str(bare / "tokenizer.json"))
    assert "tokenizer file" in problem.message


def test_synthetic_chat_set_trains_as_chat_data(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_data_parser(parser.add_subparsers(dest="command"))
    out, folder = tmp_path / "chat.jsonl", tmp_path / "tok"
    args = parser.parse_args(
        ["data", "make-synthetic-chat", str(out), "--samples", "40", "--tokenizer", str(folder)]
    )
    assert cmd_data(args) == 0
    conversations = list(read_conversations(out))
    assert len(conversations) == 40 and all(m[0]["role"] == "system" for _, m in conversations)
    assert max(len(exchanges(m)) for _, m in conversations) > 1
    ds = dataset(out, folder, seq=SEQ, packing=True)
    assert ds.truncated == ds.skipped == 0 and len(ds.samples) == 40
    assert checked(str(folder)) == []
