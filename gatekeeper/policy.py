"""Policy files: pydantic models, loading with YAML line numbers in every error, and the policy hash.

A policy says which paths a model owns, which outside touchpoints it may edit (with line budgets), how
agent assistance is detected, which mode that selects, and the settings of the four checks. A policy for a
whole engine lists several owned `packages` (each with its own paths, guard, tests and perf axes); a policy
without `packages` is the one-package shorthand: its top-level `owned_paths` and `checks` are that package.
"""

from __future__ import annotations

import hashlib
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gatekeeper.errors import InputError
from gatekeeper.verdict import CHECK_IDS, CheckId

POLICY_VERSION = 1

# Identities seen in Co-authored-by trailers and bot logins of coding agents. Policies extend this list.
DEFAULT_AGENT_IDENTITIES = (
    "Claude", "anthropic", "Copilot", "Cursor", "Codex", "OpenAI", "Aider", "Devin", "Gemini", "Kimi",
    "Moonshot", "Jules", "Amp", "Windsurf", "Codeium", "Cline", "Roo", "OpenHands", "SWE-agent", "Sweep",
    "Tabnine", "Qodo", "Augment", "Factory", "Goose", "Junie",
)


def _checked_glob(glob: str) -> str:
    """A repository glob (see gatekeeper.paths) that can match something and cannot climb out of the root."""
    if not glob:
        raise ValueError("empty glob")
    if not glob.isprintable():
        raise ValueError(f"glob {glob!r} contains control or invisible characters")
    if glob.startswith("/"):
        raise ValueError(f"glob {glob!r}: globs are relative to the repository root; drop the leading '/'")
    if glob.endswith("/"):
        raise ValueError(f"glob {glob!r} ends in '/' and matches no file; write '{glob}**' for every file below it")
    if any(segment in ("", ".", "..") for segment in glob.split("/")):
        raise ValueError(f"glob {glob!r} has an empty, '.' or '..' segment")
    return glob


Glob = Annotated[str, AfterValidator(_checked_glob)]


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: reject them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mode(str, Enum):
    strict = "strict"    # bounded review: every check enabled in the policy is required
    default = "default"  # ordinary review: only the checks listed in `default_mode_checks` are required


class AgentDetection(_Strict):
    # Assisted-by: `AGENT:MODEL [TOOLS]` (Linux kernel) or `<tool>` (LLVM); AI-used-for: what it was used for.
    trailers: tuple[str, ...] = ("Assisted-by", "Generated-by", "Made-with", "AI-assisted", "AI-used-for")
    coauthor_trailers: tuple[str, ...] = ("Co-authored-by",)
    agent_identities: tuple[str, ...] = DEFAULT_AGENT_IDENTITIES
    extra_agent_identities: tuple[str, ...] = ()
    labels: tuple[str, ...] = ("agent-assisted", "ai-assisted", "ai-generated")
    disclosure_heading: str = "Agent assistance"
    bot_authors: tuple[str, ...] = ("*[bot]", "copilot-swe-agent", "devin-ai-integration", "Copilot")
    # What a signal selects, and what the absence of any signal selects (absence is not proof of absence).
    on_signal: Mode = Mode.strict
    on_no_signal: Mode = Mode.default

    @property
    def identities(self) -> tuple[str, ...]:
        return self.agent_identities + self.extra_agent_identities


class Touchpoint(_Strict):
    """A file outside the owned paths that the contribution may edit, within a budget of lines."""

    path: Glob  # usually one file; a glob shares one budget among the files it matches
    max_added: int = Field(ge=0)
    max_removed: int = Field(ge=0)
    reason: str = ""


class ConfinementSettings(_Strict):
    enabled: bool = True
    allow_binary: bool = False
    allow_submodules: bool = False
    # A symlink is allowed only if it lives in an owned path and points inside the owned paths.
    allow_symlinks: bool = True
    allow_mode_changes: bool = True


class GuardProbe(_Strict):
    """A deployment handed to the guard: `expect: reject` must raise naming `must_name`; `accept` must not."""

    name: str
    deployment: dict[str, Any]
    expect: Literal["reject", "accept"]
    must_name: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _names_only_for_rejects(self) -> GuardProbe:
        if self.must_name and self.expect == "accept":
            raise ValueError("must_name only makes sense for probes that expect: reject")
        return self


class StartupGuardSettings(_Strict):
    enabled: bool = True
    guard: str | None = None            # "package.module:function"
    raises: str | None = None           # "package.module:ExceptionType" (or a builtin such as "ValueError")
    called_from: tuple[str, ...] = ()   # entry points that must call the guard first: "module:function"
    support_matrix: str | None = None   # "module:NAME": a machine-readable object, not prose
    deployment_factory: str | None = None  # "module:Class" building a probe's deployment from its dict
    probes: tuple[GuardProbe, ...] = ()
    timeout_s: float = Field(default=60.0, gt=0)
    # How a probe's deployment reaches the guard: "factory" hands it to `deployment_factory` (or the dict itself);
    # "vllm" builds vLLM's own VllmConfig on the CPU from `vllm_model` with the platform faked to the probe's GPU.
    probe_builder: Literal["factory", "vllm"] = "factory"
    vllm_model: str | None = None       # "vllm": an HF config.json, relative to the policy file
    probe_defaults: dict[str, Any] = Field(default_factory=dict)  # merged under every probe's deployment
    # Calls that build a kernel or allocate device memory; the guard must run before any of them. A pattern
    # with a dot matches the whole dotted call name (`torch.*`), one without matches its last part (`empty`).
    kernel_calls: tuple[str, ...] = (
        "compile", "empty", "empty_like", "zeros", "zeros_like", "ones", "full", "torch.*", "cute.*",
    )

    @field_validator("guard", "raises", "support_matrix", "deployment_factory")
    @classmethod
    def _dotted_ref(cls, value: str | None) -> str | None:
        if value is not None and not _REF.fullmatch(value):
            raise ValueError(f"{value!r} is not a 'package.module:name' reference")
        return value

    @field_validator("called_from")
    @classmethod
    def _dotted_refs(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _REF.fullmatch(value):
                raise ValueError(f"{value!r} is not a 'package.module:name' reference")
        return values

    @model_validator(mode="after")
    def _builder_needs_its_inputs(self) -> StartupGuardSettings:
        if self.probe_builder == "vllm":
            if self.vllm_model is None and self.probes:
                raise ValueError("probe_builder: vllm needs vllm_model (an HF config.json, relative to the policy file)")
            if self.deployment_factory is not None:
                raise ValueError("probe_builder: vllm builds the VllmConfig itself; drop deployment_factory")
        elif self.vllm_model is not None:
            raise ValueError("vllm_model only applies with probe_builder: vllm")
        names = [p.name for p in self.probes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(duplicates)}")
        return self


class ChangedPathTestsSettings(_Strict):
    enabled: bool = True
    command: tuple[str, ...] = ("pytest",)
    # Per file, never averaged: an untested file cannot hide behind a tested one.
    min_file_coverage: float = Field(default=1.0, ge=0.0, le=1.0)
    max_uncovered_lines_per_file: int | None = Field(default=None, ge=0)
    timeout_s: float = Field(default=1800.0, gt=0)
    # JUnit + coverage reports from a GPU run, committed in the PR: they count, labelled self-reported.
    gpu_report_globs: tuple[Glob, ...] = ()
    # Changed files the rule does not ask to be covered: the tests themselves (globs, see gatekeeper.paths).
    exclude_paths: tuple[Glob, ...] = ("tests/**", "**/tests/**", "**/test_*.py", "**/conftest.py")


class AxisExemption(_Strict):
    """Required rows whose axes match `where` (each named axis at one of its listed values) need one row at any value
    of the `ignore` axes instead of one at each: a layer whose cost an axis does not move (a KDA layer reads no KV
    cache, so the context length does not change it). `reason` is shown in the report."""

    where: dict[str, tuple[Any, ...]] = Field(min_length=1)
    ignore: tuple[str, ...] = Field(min_length=1)
    reason: str = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> AxisExemption:
        if empty := [axis for axis, values in self.where.items() if not values]:
            raise ValueError(f"where lists no value for {empty}: such an exemption matches no row")
        if both := sorted(set(self.where) & set(self.ignore)):
            raise ValueError(f"{both} both select the rows (where) and are ignored in them (ignore)")
        return self


class PerfMatrixSettings(_Strict):
    enabled: bool = True
    evidence_globs: tuple[Glob, ...] = ()     # files in the PR holding perf evidence
    body_fence: str = "gatekeeper-perf"      # ```gatekeeper-perf fenced JSON in the PR body
    extra_axes: dict[str, tuple[Any, ...]] = Field(default_factory=dict)  # e.g. layer: [kda_moe, mla_moe]
    axis_exemptions: tuple[AxisExemption, ...] = ()  # rows needed at one value of an axis, not each (AxisExemption)
    metric: str = "latency"
    # GPU models the evidence must come from (hardware.gpu contains one of them, case-insensitive), e.g. [H200]: the
    # arch axis names a family (sm_90: H100 and H200), not the card whose bandwidth the floors and timings are of.
    gpus: tuple[str, ...] = ()
    min_runs: int = Field(default=10, ge=1)
    max_spread_pct: float = Field(default=10.0, gt=0)
    max_regression_pct: float = Field(default=2.0, ge=0)
    commit_window: int = Field(default=0, ge=0)  # how many commits behind the PR head the evidence may be
    # What ages evidence: every commit ("all"), or only commits that change the owned paths ("owned": a commit
    # elsewhere in the repository leaves the contribution, and so what was measured, as it was).
    commit_window_counts: Literal["all", "owned"] = "all"
    # With "owned", the paths whose changes count, when not all the owned paths can change what was measured
    # (the contribution's code, say, without its notes and evidence files).
    commit_window_paths: tuple[Glob, ...] = ()

    @field_validator("gpus")
    @classmethod
    def _gpu_names(cls, gpus: tuple[str, ...]) -> tuple[str, ...]:
        if blank := [g for g in gpus if not g.strip()]:
            raise ValueError(f"gpus holds {len(blank)} blank name(s): a blank name matches every GPU")
        return gpus

    @model_validator(mode="after")
    def _window_paths_only_when_counting_owned(self) -> PerfMatrixSettings:
        if self.commit_window_paths and self.commit_window_counts != "owned":
            raise ValueError("commit_window_paths only applies with commit_window_counts: owned")
        return self


_PACKAGE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Package(_Strict):
    """One owned package of an engine: its paths, and the settings of the evidence rules that judge it.
    A setting left out is the policy's top-level one (`checks.<rule>`)."""

    name: str = Field(pattern=_PACKAGE_NAME)
    model: str = ""   # who it serves, for the blast radius: "Kimi K3"
    scope: str = ""   # what it specializes: "pure decode (decode_backend=latency_specialized)"
    owned_paths: tuple[Glob, ...] = Field(min_length=1)
    startup_guard: StartupGuardSettings | None = None
    changed_path_tests: ChangedPathTestsSettings | None = None
    perf_matrix: PerfMatrixSettings | None = None


class Checks(_Strict):
    confinement: ConfinementSettings = ConfinementSettings()
    startup_guard: StartupGuardSettings = StartupGuardSettings(enabled=False)
    changed_path_tests: ChangedPathTestsSettings = ChangedPathTestsSettings(enabled=False)
    perf_matrix: PerfMatrixSettings = PerfMatrixSettings(enabled=False)

    def enabled(self) -> tuple[CheckId, ...]:
        return tuple(c for c in CHECK_IDS if getattr(self, c).enabled)


class AppSettings(_Strict):
    """How the GitHub App applies the policy (the CLI ignores these)."""

    # A required rule that waits for CI's evidence keeps the check in progress this long after the App
    # first judged the head; then, still undecided, it concludes `action_required`.
    evidence_wait_minutes: int = Field(default=120, ge=0, le=7 * 24 * 60)
    # Whether a PR's author may override the gatekeeper on their own PR (with write permission).
    allow_author_override: bool = False
    # single: one check run, `gatekeeper / <policy name>`, for the whole verdict. per_rule: that run and also one
    # per enabled rule, `gatekeeper / <policy name> / <rule>`, so a ruleset can require a subset of the rules.
    check_runs: Literal["single", "per_rule"] = "single"


class Policy(_Strict):
    version: Literal[1]
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$")
    description: str = ""
    # The one-package shorthand's package: who it serves and what it specializes (the blast radius says both).
    model: str = ""
    scope: str = ""
    owned_paths: tuple[Glob, ...] = Field(min_length=1)
    touchpoints: tuple[Touchpoint, ...] = ()
    agent_detection: AgentDetection = AgentDetection()
    default_mode_checks: tuple[CheckId, ...] = ("changed_path_tests",)
    # Rules whose evidence must come from the collector on the base branch's workflow, not the PR itself.
    require_trusted: tuple[CheckId, ...] = ()
    max_files: int = Field(default=3000, ge=1, le=3000)
    checks: Checks = Checks()
    # Several owned packages, each judged on its own when a change touches it. Empty: the one-package shorthand.
    packages: tuple[Package, ...] = ()
    # Rules on trial: reported ("would have failed"), never blocking.
    shadow: tuple[CheckId, ...] = ()
    app: AppSettings = AppSettings()

    @model_validator(mode="before")
    @classmethod
    def _owned_paths_of_the_packages(cls, data: Any) -> Any:
        # With packages the owned paths are theirs; the top level must not give a second, diverging list.
        if isinstance(data, dict) and data.get("packages"):
            if "owned_paths" in data:
                raise ValueError("owned_paths: give the owned paths in each package, not at the top level as well")
            packages = data["packages"]
            if isinstance(packages, list):
                data = {**data, "owned_paths": [g for p in packages if isinstance(p, dict)
                                                for g in (p.get("owned_paths") or []) if isinstance(g, str)] or None}
        return data

    @field_validator("packages")
    @classmethod
    def _unique_packages(cls, packages: tuple[Package, ...]) -> tuple[Package, ...]:
        names = [p.name for p in packages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"package names must be unique; repeated: {', '.join(duplicates)}")
        return packages

    def required_checks(self, mode: Mode) -> tuple[CheckId, ...]:
        enabled = self.checks.enabled()
        if mode is Mode.strict:
            return enabled
        return tuple(c for c in enabled if c in self.default_mode_checks)

    def package_list(self) -> tuple[Package, ...]:
        """The owned packages; the one-package shorthand is a package named after the policy."""
        if self.packages:
            return self.packages
        return (Package(name=self.name, model=self.model, scope=self.scope, owned_paths=self.owned_paths,
                        startup_guard=self.checks.startup_guard,
                        changed_path_tests=self.checks.changed_path_tests, perf_matrix=self.checks.perf_matrix),)

    def for_package(self, package: Package) -> Policy:
        """This policy as the checks see it for one package: its owned paths and its rule settings (each rule
        keeps the top level's `enabled`, so a package cannot switch a rule the policy requires off)."""
        def merged(rule: str, own: BaseModel | None) -> BaseModel:
            top = getattr(self.checks, rule)
            if own is None:
                return top
            # What the package sets wins; what it leaves out is the top level's (its evidence globs, its bounds).
            return top.model_copy(update={k: getattr(own, k) for k in own.model_fields_set if k != "enabled"})

        checks = self.checks.model_copy(update={
            "startup_guard": merged("startup_guard", package.startup_guard),
            "changed_path_tests": merged("changed_path_tests", package.changed_path_tests),
            "perf_matrix": merged("perf_matrix", package.perf_matrix),
        })
        return self.model_copy(update={"owned_paths": package.owned_paths, "checks": checks, "packages": ()})


_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$|^[A-Za-z_]\w*$")


class LoadedPolicy(BaseModel):
    """A validated policy with where it came from and the hash the verdict and the App's idempotency use."""

    model_config = ConfigDict(frozen=True)

    policy: Policy
    source: str
    sha256: str


def load_policy_text(text: str, source: str) -> LoadedPolicy:
    """Parse and validate policy YAML. Every error is an InputError naming the source, YAML line and field."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputError(source, f"invalid YAML: {getattr(exc, 'problem', None) or exc}", line) from None
    if not isinstance(data, dict):
        raise InputError(source, "a policy must be a YAML mapping", 1)
    duplicate = _first_duplicate_key(root)
    if duplicate is not None:
        key, line, first_line = duplicate
        raise InputError(source, f"duplicate key {key!r} (first set on line {first_line}; YAML would keep only the last)",
                         line)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        # The first error gives the line; the next few follow with their own lines, so that a typo'd key
        # is reported together with the required field it failed to set.
        errors = [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]
        described = [f"{_field(loc)}: {msg}" for loc, msg in errors[:1]]
        described += [f"{_field(loc)} (line {_line_of(root, loc)}): {msg}" for loc, msg in errors[1:_MAX_ERRORS]]
        if len(errors) > _MAX_ERRORS:
            described.append(f"and {len(errors) - _MAX_ERRORS} more")
        raise InputError(source, "; ".join(described), _line_of(root, errors[0][0])) from None
    return LoadedPolicy(policy=policy, source=source, sha256=hashlib.sha256(text.encode()).hexdigest())


_MAX_ERRORS = 5


def _first_duplicate_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """(key, its line, the line it was first set on) of the first key repeated in one mapping, depth first."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                return name, key.start_mark.line + 1, seen[name]
            seen[name] = key.start_mark.line + 1
            found = _first_duplicate_key(value)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _first_duplicate_key(item)
            if found is not None:
                return found
    return None


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_policy(path: str | Path) -> LoadedPolicy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read policy: {exc}") from None
    return load_policy_text(text, str(path))


def field_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """The YAML line (1-based) of the field at `loc` (a pydantic-style location) in valid policy text."""
    return _line_of(yaml.compose(text, Loader=yaml.SafeLoader), loc)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Walk the composed YAML tree along a pydantic error location; return the deepest line found (1-based)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            if match is None:
                key = next((k for k, _ in node.value if k.value == str(part)), None)
                return key.start_mark.line + 1 if key is not None else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def policy_json_schema() -> dict[str, Any]:
    return Policy.model_json_schema()
