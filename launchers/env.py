"""Environment variables by owner, and secrets by name only.

- The recipe owns process knobs (CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*, TORCH_NCCL_*): they follow
  from the config (TP/CP overlap, DP overlap), so `recipe_env` derives them from it.
- The launcher owns the knobs of torchrun itself (its log level) and of the ranks' interpreter
  (PYTHONSAFEPATH: the working directory stays off sys.path).
- The cluster profile owns fabric knobs ([fabric]: NCCL_IB_*, NCCL_SOCKET_IFNAME, UCX_*, FI_*) and
  other site variables ([env]: HF_HOME, TRITON_CACHE_DIR ...). Neither table may set a recipe's knob.
- A variable already set in the user's environment wins over all of them: generated scripts write
  defaults (`default_env NAME value` sets NAME only when unset), never overrides.
- Secrets (WANDB_API_KEY, HF_TOKEN, *_API_KEY, *_TOKEN, *SECRET*, *PASSWORD*) are never written into
  a generated file: they reach the ranks by name (inheritance, pyxis --container-env NAME,
  APPTAINERENV_NAME=$NAME). A profile value that assigns one (`export HF_TOKEN=...` in `setup`) or
  holds a well-known token format (`secrets_in`) is refused.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from config.schema import TrainingConfig
from config.tree import suggest

_SECRET = re.compile(r"(_API_KEY|_TOKEN)\Z|SECRET|PASSWORD|\AWANDB_API_KEY\Z|\AHF_TOKEN\Z")
RECIPE_PREFIXES = ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_", "TORCH_NCCL_")
FABRIC_PREFIXES = (
    "NCCL_",
    "UCX_",
    "FI_",
    "NVSHMEM_",
    "OMPI_MCA_",
    "PMIX_",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Well-known fabric variables: a name one typo away from one of these is refused (NCCL ignores
# a variable it does not know, so NCCL_IB_HAC would silently leave the default HCA selection).
KNOWN_FABRIC = """
NCCL_IB_HCA NCCL_IB_GID_INDEX NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_SL NCCL_IB_TC
NCCL_IB_QPS_PER_CONNECTION NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_DISABLE
NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_AR_THRESHOLD NCCL_IB_MERGE_NICS NCCL_IB_ROCE_VERSION_NUM
NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_NET
NCCL_NET_PLUGIN NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_CROSS_NIC NCCL_NVLS_ENABLE
NCCL_COLLNET_ENABLE NCCL_P2P_LEVEL NCCL_P2P_DISABLE NCCL_SHM_DISABLE NCCL_CUMEM_ENABLE
NCCL_ALGO NCCL_PROTO NCCL_MIN_NCHANNELS NCCL_MAX_NCHANNELS NCCL_BUFFSIZE NCCL_TOPO_FILE
NCCL_TUNER_PLUGIN NCCL_IGNORE_CPU_AFFINITY NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE
UCX_NET_DEVICES UCX_TLS UCX_IB_PCI_RELAXED_ORDERING FI_PROVIDER FI_EFA_USE_DEVICE_RDMA
FI_EFA_FORK_SAFE FI_LOG_LEVEL GLOO_SOCKET_IFNAME TP_SOCKET_IFNAME
""".split()


# NAME=VALUE anywhere in a text: `export HF_TOKEN=...`, `--export=ALL,HF_TOKEN=...`; a '-' in a
# name counts as '_', so the option `--wandb-api-key=...` assigns WANDB_API_KEY.
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_-]*)=")
# Values in well-known token formats, whatever name they are given (or none).
TOKEN_FORMATS = {
    "Hugging Face token (hf_...)": re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}"),
    "GitHub token (ghp_..., github_pat_...)": re.compile(
        r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"
    ),
    "AWS access key (AKIA...)": re.compile(
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    ),
    # Also the length of a full git commit hash: the message says how to give one.
    "W&B API key (40 hex digits; a git commit hash? give its first 12)": re.compile(
        r"(?<![A-Za-z0-9])[0-9a-f]{40}(?![A-Za-z0-9])"
    ),
}


def is_secret(name: str) -> bool:
    """Whether a variable must travel by name only (never as a value in a generated file)."""
    return bool(_SECRET.search(name.upper()))


def secrets_in(text: str) -> list[str]:
    """The secrets `text` would write into a file, described without their values: the secret
    variables it assigns and the well-known tokens it holds."""
    names = sorted(set(_ASSIGNMENT.findall(text)))
    found = [f"assigns {name}" for name in names if is_secret(name.replace("-", "_"))]
    return found + [
        f"holds what looks like a secret: {kind}"
        for kind, rx in TOKEN_FORMATS.items()
        if rx.search(text)
    ]


def recipe_owned(name: str) -> bool:
    return name.startswith(RECIPE_PREFIXES)


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str
    owner: str  # "recipe", "launcher", "profile [env]" or "profile [fabric]"
    why: str = ""


def recipe_env(cfg: TrainingConfig) -> list[EnvVar]:
    """The process knobs this config needs; on the CPU only the one Megatron checks for TP/CP."""
    par, out = cfg.parallel, []
    model_parallel = par.tensor_model_parallel_size > 1 or par.context_parallel_size > 1
    if model_parallel and not par.use_megatron_fsdp:
        # Megatron overlaps TP/CP communication with GEMMs by the order it issues kernels; one
        # hardware queue keeps that order (Megatron-Core warns when it is unset, even on the CPU).
        # Not with Megatron-FSDP, whose gathers run on side streams: Megatron-LM refuses 1 there.
        why = "TP/CP communication overlap"
        out.append(EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1", "recipe", why))
    elif par.overlap_moe_expert_parallel_comm and cfg.train.device != "cpu":
        # The MoE alltoall overlap runs its communication on a side stream beside the compute: it
        # wants many hardware queues (Megatron-Bridge's Qwen3 H100 runs set 32). With TP or CP the
        # single queue above wins, as in Megatron-Bridge's DeepSeek-V3 H100 runs.
        why = "MoE alltoall overlap: streams run side by side"
        out.append(EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "32", "recipe", why))
    if cfg.train.device == "cpu":
        return out
    if par.overlap_grad_reduce or par.overlap_param_gather:
        # Leave SMs free for the overlapped reduce-scatter/all-gather kernels; TE's LayerNorm
        # kernels would otherwise take every SM and serialise them (NeMo's perf setting).
        why = "DP overlap: SMs for NCCL kernels"
        out.append(EnvVar("NVTE_FWD_LAYERNORM_SM_MARGIN", "16", "recipe", why))
        out.append(EnvVar("NVTE_BWD_LAYERNORM_SM_MARGIN", "16", "recipe", why))
    # Gradient buckets are used on side streams: without this, recordStream holds their memory
    # until the caching allocator next syncs, which costs GiBs at large bucket sizes.
    why = "frees NCCL buffers promptly"
    out.append(EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "1", "recipe", why))
    return out


def launcher_env() -> list[EnvVar]:
    """The knobs of torchrun and of the ranks' interpreter."""
    return [
        # torchrun's agent logs at INFO repeat every setting on every node.
        EnvVar("LOGLEVEL", "WARNING", "launcher", "quiet torchrun agent logs"),
        # `python -m training.entry` would put the ranks' working directory first on sys.path,
        # where a user's config.py, data/ or training.py shadows the project's packages; safe
        # path leaves it off, and the ranks import the project as installed (or from PYTHONPATH).
        EnvVar("PYTHONSAFEPATH", "1", "launcher", "the working directory stays off sys.path"),
    ]


def fabric_problems(fabric: Mapping[str, str]) -> list[tuple[str, str]]:
    """Names in a profile's [fabric] table that are not fabric variables."""
    problems = []
    for name in fabric:
        if not _NAME.match(name):
            problems.append(
                (
                    f"fabric[{name!r}]",
                    f"{name!r} is not a valid environment variable name (letters, digits and '_', not first a digit)",
                )
            )
            continue
        where = f"fabric.{name}"
        if is_secret(name):
            problems.append((where, f"looks like a secret: export {name} in your shell instead"))
        elif recipe_owned(name):
            problems.append(
                (
                    where,
                    "a process knob owned by the recipe (launchers/env.py derives it from the config); export it in your shell to override one run",
                )
            )
        elif name not in KNOWN_FABRIC and difflib.get_close_matches(name, KNOWN_FABRIC, 1, 0.85):
            close = difflib.get_close_matches(name, KNOWN_FABRIC, 1, 0.85)[0]
            problems.append((where, f"unknown fabric variable. Did you mean '{close}'?"))
        elif not name.startswith(FABRIC_PREFIXES):
            hint = (
                suggest(name, KNOWN_FABRIC)
                or f" Fabric variables start with {', '.join(FABRIC_PREFIXES)}; other site variables go in [env]."
            )
            problems.append((where, f"not a fabric variable.{hint}"))
    return problems


def env_problems(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Names in a profile's [env] table that belong to the recipe."""
    return [
        (
            f"env.{name}",
            "a process knob owned by the recipe; export it in your shell to override one run",
        )
        for name in env
        if recipe_owned(name)
    ]


@dataclass(frozen=True, slots=True)
class EnvPlan:
    """What a job's environment gets: defaults by owner, and names forwarded from the user's."""

    defaults: list[EnvVar]  # set only where the user's environment leaves them unset
    secrets: list[str] = field(default_factory=list)  # set in the user's environment; names only
    user_wins: list[str] = field(default_factory=list)  # defaults the user's environment overrides

    @property
    def names(self) -> list[str]:
        """Every name the ranks must see (what a container must let through)."""
        return [v.name for v in self.defaults] + self.secrets

    def process_env(self, user_env: Mapping[str, str]) -> dict[str, str]:
        """For a local launch: the defaults the user's environment does not already set."""
        return {v.name: v.value for v in self.defaults if v.name not in user_env}


def plan_env(
    cfg: TrainingConfig,
    fabric: Mapping[str, str],
    site: Mapping[str, str],
    user_env: Mapping[str, str],
) -> EnvPlan:
    """Merge the owners' variables (later owners win a name) and pick out the user's secrets."""
    merged: dict[str, EnvVar] = {}
    layers = (
        recipe_env(cfg),
        launcher_env(),
        [EnvVar(k, str(v), "profile [env]") for k, v in site.items()],
        [EnvVar(k, str(v), "profile [fabric]") for k, v in fabric.items()],
    )
    for layer in layers:
        for var in layer:
            merged[var.name] = var
    defaults = list(merged.values())
    secrets = sorted(name for name in user_env if is_secret(name) and _NAME.match(name))
    user_wins = [v.name for v in defaults if v.name in user_env]
    return EnvPlan(defaults=defaults, secrets=secrets, user_wins=user_wins)
