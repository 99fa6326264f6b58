"""Tokenizers from local files only, shaped the way Megatron-Core's datasets use them.

Megatron-Core's GPT datasets read `vocab_size`, `eod`, `pad` (and, if present, `eos` and
`special_tokens_dict`) from the tokenizer, and hash `unique_identifiers` into the names of their
index caches. `LocalTokenizer` provides those plus the `tokenize` / `detokenize` pair of
`megatron.core.tokenizers.MegatronTokenizerBase`. It does not subclass that base on purpose: importing
anything under `megatron.core` costs ~5 s (its `__init__` pulls in the optimizer), and nothing in the
datasets checks the type. Nothing here ever reaches a model hub: a path that does not exist is an
error, never a hub id.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from config.hf import read_json
from config.schema import data_kind
from data.template_limit import bounded

if TYPE_CHECKING:
    from config.schema import TrainingConfig

# End-of-document candidates, most specific first, for a bare tokenizer.json that does not say
# which token ends a document: GPT-2/Qwen/ours, Llama 3 base, Llama 2/Mistral, Gemma.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
# "No pad token": the value Megatron-Core's datasets themselves fall back to (_PAD_TOKEN_ID).
NO_PAD = -1


class LocalTokenizer:
    """A `tokenizers.Tokenizer` or a transformers tokenizer behind Megatron's tokenizer interface."""

    def __init__(
        self,
        backend: Any,
        *,
        path: str,
        eod: int,
        pad: int = NO_PAD,
        bos: int | None = None,
        is_transformers: bool = False,
    ) -> None:
        self._backend = backend
        self._is_transformers = is_transformers
        self.path = path
        self._eod = eod
        self._pad = pad
        self._bos = bos

    # --- what Megatron-Core's datasets read -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can emit, added special tokens included."""
        if self._is_transformers:
            return len(self._backend)
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def eos(self) -> int:
        return self._eod

    @property
    def eos_id(self) -> int:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def bos(self) -> int | None:
        return self._bos

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def unique_identifiers(self) -> OrderedDict:
        # Part of the hash that names Megatron's cached sample indices: same file, same cache.
        return OrderedDict(
            [
                ("class", f"{type(self).__module__}.{type(self).__qualname__}"),
                ("tokenizer_path", self.path),
                ("vocab_size", self.vocab_size),
                ("eod", self._eod),
            ]
        )

    # --- text <-> ids -------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Text to ids, with the tokenizer's own special tokens (e.g. Llama 3's BOS), as Megatron's
        HuggingFace wrapper does by default. The end-of-document token is never added here."""
        if self._is_transformers:
            return list(self._backend(text)["input_ids"])
        return self._backend.encode(text).ids

    def tokenize_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Many texts at once (the `tokenizers` backend spreads a batch over threads).

        `add_special_tokens=False` leaves out the tokenizer's own BOS and the like: for text that
        continues another (an SFT response after its prompt)."""
        if self._is_transformers:
            encoded = self._backend(texts, add_special_tokens=add_special_tokens)
            return [list(ids) for ids in encoded["input_ids"]]
        return [
            enc.ids
            for enc in self._backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        ]

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab(self) -> dict[str, int]:
        return self._backend.get_vocab()

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    @property
    def transformers_tokenizer(self) -> Any | None:
        """The transformers tokenizer behind this one (chat templates, character offsets:
        data/chat.py); None for a bare tokenizer.json."""
        return self._backend if self._is_transformers else None

    @property
    def library_tokenizer(self) -> Any | None:
        """The `tokenizers.Tokenizer` that encodes for this one (a transformers fast tokenizer's
        backend, or the bare tokenizer.json's); None behind a slow transformers tokenizer."""
        if self._is_transformers:
            return getattr(self._backend, "backend_tokenizer", None)
        return self._backend

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        """transformers' rendering, within data/template_limit.py's bound on the template's
        loops (TemplateTooLong, naming this tokenizer, past it)."""
        if not self._is_transformers:
            raise NotImplementedError(
                f"{self.path}: chat templates need an HF tokenizer folder and the transformers "
                "package; a bare tokenizer.json carries no template"
            )
        with bounded(self.path):
            return self._backend.apply_chat_template(conversation, **kwargs)


def load_tokenizer(path: str | Path, *, eod_token: str | None = None) -> LocalTokenizer:
    """Load a local `tokenizer.json` file or HF tokenizer folder; never touches a hub.

    A folder goes through transformers' AutoTokenizer (local_files_only) when transformers is
    installed, else through its tokenizer.json plus the special-token names in
    tokenizer_config.json. `eod_token` overrides which token ends a document.
    """
    p = Path(path).expanduser()
    if not p.exists():
        # Never fall through to a hub lookup: a missing path is a typo, not a model id.
        raise FileNotFoundError(
            f"data.tokenizer={str(path)!r} does not exist; give a local tokenizer.json file or an "
            "HF tokenizer folder (hub downloads are disabled)"
        )
    if p.is_dir():
        try:
            import transformers  # noqa: F401 - only to learn whether it is installed
        except ImportError:
            return _load_tokenizers_json(
                _folder_json(p), str(p), _folder_special_tokens(p), eod_token
            )
        return _load_transformers(p, eod_token)
    return _load_tokenizers_json(p, str(p), {}, eod_token)


# tokenizer_config.json classes under which transformers runs tokenizer.json as written: their
# ids are the bare `tokenizers` library's (model-named classes may rebuild the pipeline).
PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_plain_tokenizer(path: str | Path) -> LocalTokenizer | None:
    """A folder's tokenizer without importing transformers (~6 CPU-seconds), where transformers
    would run its tokenizer.json unchanged: a generic tokenizer class and no add_bos_token /
    add_eos_token to rewrite the template; None otherwise (load_tokenizer then)."""
    p = Path(path).expanduser()
    config = p / "tokenizer_config.json"
    if not (p.is_dir() and (p / "tokenizer.json").is_file() and config.is_file()):
        return None
    data = read_json(config)
    if data.get("tokenizer_class") not in PLAIN_CLASSES or {"add_bos_token", "add_eos_token"} & set(
        data
    ):
        return None
    return _load_tokenizers_json(p / "tokenizer.json", str(p), _folder_special_tokens(p), None)


def null_tokenizer(vocab_size: int) -> Any:
    """Megatron-Core's own null tokenizer for mock data: ids are the text, eod is vocab_size - 1."""
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(
        metadata_path={"library": "null-text"}, vocab_size=vocab_size
    )


def build_tokenizer(cfg: TrainingConfig) -> Any:
    """The tokenizer a run uses: data.tokenizer when set, else a null one (for a data kind that
    needs none, config/registry.py: mock data)."""
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    kind = data_kind(cfg)
    if kind is None or kind.needs_tokenizer:
        raise ValueError(
            f"data.tokenizer is unset but data.kind={cfg.data.kind!r} needs the tokenizer that made "
            "the data; set data.tokenizer=/path/to/tokenizer.json (or an HF tokenizer folder)"
        )
    return null_tokenizer(cfg.model.vocab_size)


# --- loaders ----------------------------------------------------------------------------------
def _folder_json(folder: Path) -> Path:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"data.tokenizer={str(folder)!r} has no tokenizer.json and transformers is not "
            "installed to read its other formats; install transformers or convert it"
        )
    return path


def _token_name(value: Any) -> str | None:
    # tokenizer_config.json writes a special token either as "</s>" or as {"content": "</s>", ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _folder_special_tokens(folder: Path) -> dict[str, str]:
    """eos/bos/pad token names from an HF folder's tokenizer_config.json or special_tokens_map.json."""
    names: dict[str, str] = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        f = folder / fname
        if f.is_file():
            data = read_json(f)
            for key in ("eos_token", "bos_token", "pad_token"):
                name = _token_name(data.get(key))
                if name:
                    names[key] = name
    return names


def _load_tokenizers_json(
    file: Path, shown_path: str, names: dict[str, str], eod_token: str | None
) -> LocalTokenizer:
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a bare Exception with the parse error
        raise ValueError(f"data.tokenizer={shown_path!r}: cannot read {file}: {err}") from err

    def ident(name: str | None) -> int | None:
        return None if name is None else backend.token_to_id(name)

    if eod_token or names.get("eos_token"):
        wanted = eod_token or names["eos_token"]
        eod = ident(wanted)
        if eod is None:
            raise ValueError(
                f"data.tokenizer={shown_path!r}: end-of-document token {wanted!r} "
                "is not in its vocabulary"
            )
    else:
        found = [i for n in EOD_CANDIDATES if (i := ident(n)) is not None]
        if not found:
            raise ValueError(
                f"data.tokenizer={shown_path!r}: cannot tell which token ends a document; none of "
                f"{', '.join(EOD_CANDIDATES)} is in its vocabulary. Add one as a special token "
                "(python -m data.tools.make_tokenizer adds <|endoftext|>)"
            )
        eod = found[0]
    pad = ident(names.get("pad_token"))
    return LocalTokenizer(
        backend,
        path=shown_path,
        eod=eod,
        pad=NO_PAD if pad is None else pad,
        bos=ident(names.get("bos_token")),
    )


def _load_transformers(folder: Path, eod_token: str | None) -> LocalTokenizer:
    from transformers import AutoTokenizer

    # local_files_only: a folder without the files raises instead of downloading.
    try:
        backend = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(
            f"data.tokenizer={str(folder)!r}: transformers cannot load a tokenizer from this "
            f"folder ({err})"
        ) from err
    # One token in, one id out (a list of tokens would give a list of ids).
    eod = cast(int, backend.convert_tokens_to_ids(eod_token)) if eod_token else backend.eos_token_id
    if eod is None or (eod_token and eod == backend.unk_token_id):
        raise ValueError(
            f"data.tokenizer={str(folder)!r}: no end-of-document token "
            f"({eod_token or 'eos_token is unset'}); set eos_token in tokenizer_config.json"
        )
    pad = backend.pad_token_id
    return LocalTokenizer(
        backend,
        path=str(folder),
        eod=int(eod),
        pad=NO_PAD if pad is None else int(pad),
        bos=backend.bos_token_id,
        is_transformers=True,
    )
