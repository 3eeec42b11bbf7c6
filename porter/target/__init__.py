"""A target: the Metal engine to port, as described by targets/<name>/target.toml.

Source paths are resolved against a checkout the user provides (nothing of the
engine's own code lives in the workspace); CUDA conventions, scripted answers
and the fixture script are resolved against the target folder, which is ours.
"""

from __future__ import annotations

import glob
import os
import tomllib
from functools import cached_property
from typing import Annotated, Literal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from porter.host import arch as gpu_arch
from porter.target.cparse import ApiFunction, parse_api_header
from porter.errors import PorterError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    default_checkout: str | None = None
    api_header: str
    symbol_prefix: str
    metal_host: str
    metal_sources: list[str]
    cpu_backend: str | None = None
    engine: str
    engine_sources: list[str] = Field(default_factory=list)  # more files the call graph follows


class EngineSpec(_Strict):
    prefill: str
    decode: str


class UnitsSpec(_Strict):
    runtime: list[str] = Field(default_factory=list)
    skip: list[str] = Field(default_factory=list)  # API functions not ported (host-only helpers)
    # runtime units whose correct port may be trivial (a constant return, a log line): the static
    # gate still checks linkage and signature but not for a stub body
    trivial: list[str] = Field(default_factory=list)


class RulesSpec(_Strict):
    """[cuda.rules]: the rules of this target's CUDA code that the model must follow, rendered into its
    system prompt (porter/prompt/templates/system.j2) and checked against the conventions header by
    porter.prompt.rules: a rule written once for every target would contradict some target."""

    # "legacy": every launch on the legacy default stream (0); "accessor": on the stream the conventions
    # header's function `stream_accessor` returns
    stream: Literal["legacy", "accessor"]
    stream_accessor: str | None = None
    # what the API's int functions return: ds4 1 on success and 0 on failure, minimoe 0 and -1
    success_return: str
    failure_return: str
    # how a unit turns a launch error into its failure return, as the conventions header offers it
    launch_check: str
    tensor: str  # the tensor struct the conventions header defines
    # where backend state that lives between calls is kept (the rule against caching names it)
    shared_state: str
    # device libraries a unit may call through the conventions (e.g. cuBLAS through its shared handle)
    libraries: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _accessor_named(self):
        if (self.stream == "accessor") != bool(self.stream_accessor):
            raise ValueError("stream = \"accessor\" needs stream_accessor (the conventions header's function), "
                             "and only it does")
        return self


class CudaSpec(_Strict):
    dir: str = "cuda"
    conventions_header: str
    glue: list[str] = Field(default_factory=list)
    library: str
    nvcc_flags: list[str] = Field(default_factory=list)  # never an architecture: see default_arch
    # the GPU architecture a machine without a GPU builds for; one with GPUs builds for them, and the
    # user may name others (porter.host.arch)
    default_arch: str
    # the GPU kinds every verdict must hold on ("sm_90", "sm_121"): a unit is verified only once parity
    # (and perf) passed on a GPU of each; the build is made for each as well (porter.host.arch.required)
    required_archs: list[str] = Field(default_factory=list)
    link_flags: list[str] = Field(default_factory=list)
    # headers of the toolkit beyond the CUDA runtime's that the conventions header includes (cuBLAS, cub):
    # a toolkit without one cannot build any unit, and `porter doctor` / the run's preflight say so first
    toolkit_headers: list[str] = Field(default_factory=list)
    # the stream units launch on, in words for failure texts: "mini_cuda_stream()", "the legacy default stream (0)"
    stream: str = "the unit's stream"
    rules: RulesSpec

    @field_validator("default_arch")
    @classmethod
    def _arch_name(cls, v: str) -> str:
        try:
            return gpu_arch.normalize(v)
        except PorterError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("required_archs")
    @classmethod
    def _required_names(cls, v: list[str]) -> list[str]:
        try:
            return list(gpu_arch.required(v, named=""))
        except PorterError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _no_fixed_arch(self):
        fixed = gpu_arch.arch_flag_in(self.nvcc_flags)
        if fixed is not None:
            raise ValueError(f"nvcc_flags fixes the architecture ({fixed}): declare default_arch instead, so "
                             "builds target the GPU that runs them")
        return self


class FixtureSpec(_Strict):
    script: str
    file: str


class ThroughputSpec(_Strict):
    """[e2e.throughput]: the engine's benchmark, upstream's backend against the port's (porter.gates.e2e.throughput)."""

    prefill_tokens: int = Field(2048, ge=1)  # one prefill of this many prompt tokens
    decode_tokens: int = Field(128, ge=1)  # then this many greedy steps at that depth
    rounds: int = Field(3, ge=1)  # ABBA rounds: 4 runs each, 2 per backend


class E2ESpec(_Strict):
    """[e2e]: how porter.gates.e2e builds the engine against a backend and what it compares (see its README)."""

    driver: str  # target-folder-relative Python file: builds and runs this engine (porter.gates.e2e.driver)
    reference: str = "cpu"  # the backend the candidate is compared with
    prompt_tokens: int = Field(16, ge=1)
    decode_steps: int = Field(0, ge=0)  # greedy steps whose tokens must match (0: prefill only)
    layers: int | None = Field(None, ge=1)  # reduced layer count for a scratch build (ds4)
    # prefills of a backend per verdict, the worst judged: a missing synchronisation races, and one run
    # may come out right (measured on an H100: a copy on an unordered stream passed one run in two)
    runs: int = Field(1, ge=1)
    calibration: str = "e2e/calibration.json"  # relative to the target folder; written by the calibration run
    options: dict = Field(default_factory=dict)  # driver-specific settings
    throughput: ThroughputSpec | None = None  # absent: no tokens/s verdict for this target


class ScriptedSpec(_Strict):
    dir: str = "scripted"


class ReferenceSpec(_Strict):
    """An existing CUDA backend in the checkout that --provider reference slices (porter.providers.reference)."""

    source: str  # relative to the checkout, e.g. "ds4_cuda.cu"
    rules: str | None = None  # relative to the target folder, e.g. "reference_rules.toml"


Share = Annotated[float, Field(gt=0, le=1)]


class PerfSpec(_Strict):
    """[perf]: where and how tightly the perf gate judges (porter.gates.perf).

    `regime` is where the target's users run it: parity times every unit there, and the evidence and
    status name it.  "device": the weights are copied into device memory before the call (the harness's
    [harness.regimes] hook of that name, else its model_ptr hook); "host": the weights stay in registered
    host memory that the GPU reads over the host link.  `regimes` lists further named regimes that
    `porter dev perf-table` measures for comparison; they never decide a verdict."""

    enabled: bool = True
    # an explicit cap on candidate / known-good time; None (the default): derived from the known-good's own
    # measured run-to-run spread (perf.calibrated_limit), recorded with the calibration
    max_slowdown: float | None = Field(None, gt=0)
    baseline: str | None = None  # "upstream": porter run times the checkout's backend for missing baselines
    regime: str = "device"
    regimes: list[str] = Field(default_factory=list)
    # without a known-good: the share of the roofline a unit must reach on each timed case; `floors` per
    # unit (one share, or one per case label where the unit times cases of different kinds: a prefill
    # matmul is compute-bound where its decode is bandwidth-bound, and one share cannot suit both), then
    # the spec's own perf_floor, then `floor_fraction`, then perf.DEFAULT_FLOOR_FRACTION
    floor_fraction: Share | None = None
    floors: dict[str, Share | dict[str, Share]] = Field(default_factory=dict)


class UpstreamSpec(_Strict):
    """[upstream]: how calibration builds the checkout's own CUDA backend as one library
    (porter.calibration.libraries.build_upstream)."""

    sources: list[str]  # checkout-relative translation units
    needs: list[str] = Field(default_factory=list)  # other checkout files they include
    harness: list[str] = Field(default_factory=list)  # target-folder-relative sources of ours (calibration hooks)
    link_flags: list[str] = Field(default_factory=list)  # extra link libraries, e.g. -lcublas
    library: str  # the library's file name


class TargetSpec(_Strict):
    name: str
    description: str = ""
    source: SourceSpec
    engine: EngineSpec
    units: UnitsSpec = Field(default_factory=UnitsSpec)
    cuda: CudaSpec
    fixture: FixtureSpec | None = None
    scripted: ScriptedSpec = Field(default_factory=ScriptedSpec)
    provider: dict = Field(default_factory=dict)  # provider defaults, see porter.providers
    census: dict = Field(default_factory=dict)  # tensor-name rules -> units, see porter.target.scan.census
    perf: PerfSpec = Field(default_factory=PerfSpec)
    e2e: E2ESpec | None = None  # see porter.gates.e2e
    reference: ReferenceSpec | None = None
    upstream: UpstreamSpec | None = None


class Target:
    """A loaded target with every path resolved."""

    def __init__(self, spec: TargetSpec, target_dir: Path, checkout: Path, workspace: Path):
        self.spec = spec
        self.name = spec.name
        self.dir = target_dir
        self.checkout = checkout
        self.workspace = workspace

    # -- engine sources (in the user's checkout) --
    def _src(self, rel: str) -> Path:
        return self.checkout / rel

    @property
    def api_header(self) -> Path:
        return self._src(self.spec.source.api_header)

    @property
    def symbol_prefix(self) -> str:
        return self.spec.source.symbol_prefix

    @property
    def metal_host(self) -> Path:
        return self._src(self.spec.source.metal_host)

    @property
    def metal_sources(self) -> list[Path]:
        out: list[Path] = []
        for pattern in self.spec.source.metal_sources:
            out.extend(sorted(Path(p) for p in glob.glob(str(self.checkout / pattern))))
        return out

    @property
    def cpu_backend(self) -> Path | None:
        return self._src(self.spec.source.cpu_backend) if self.spec.source.cpu_backend else None

    @property
    def engine_sources(self) -> list[Path]:
        return [self._src(self.spec.source.engine)] + [self._src(p) for p in self.spec.source.engine_sources]

    @property
    def entry_points(self) -> dict[str, str]:
        return {"prefill": self.spec.engine.prefill, "decode": self.spec.engine.decode}

    @property
    def runtime_units(self) -> list[str]:
        return list(self.spec.units.runtime)

    # -- ours (in the target folder) --
    @property
    def cuda_dir(self) -> Path:
        return self.dir / self.spec.cuda.dir

    @property
    def conventions_header(self) -> Path:
        return self.cuda_dir / self.spec.cuda.conventions_header

    @cached_property
    def required_archs(self) -> tuple[str, ...]:
        """The GPU kinds a verdict must hold on: [cuda] required_archs and --require-arch ($PORTER_REQUIRE_ARCH);
        () when none is required (a verdict then holds for the GPU it ran on, as its evidence says)."""
        return gpu_arch.required(self.spec.cuda.required_archs)

    @cached_property
    def arch(self) -> gpu_arch.ArchChoice:
        """The GPU architectures this process builds for (named, detected, else default_arch), and every
        required one besides.  One fat library holds them all (a -gencode each), not one build per
        architecture: the build gate, its cache key and its evidence stay one; the same file is what
        every worker of a cluster loads, whatever its GPU; and nvcc fails the whole build when any one
        architecture fails, so the build gate refuses a unit that does not build for a required kind."""
        chosen = gpu_arch.choose(self.spec.cuda.default_arch)
        more = tuple(a for a in self.required_archs if a not in chosen.archs)
        return gpu_arch.ArchChoice(chosen.archs + more, chosen.how) if more else chosen

    @property
    def nvcc_flags(self) -> list[str]:
        """[cuda] nvcc_flags with the architectures of `arch` and the folders of libraries the toolkit lacks
        (porter.host.toolchain.locate): every compile of the backend uses these."""
        from porter.host.toolchain import find_nvcc, toolkit

        nvcc = find_nvcc()  # -I to a library the toolkit lacks (cuBLAS from a pip wheel): porter.host.toolchain.locate
        return [*self.spec.cuda.nvcc_flags, *gpu_arch.nvcc_flags(self.arch.archs),
                *(toolkit(nvcc).flags() if nvcc else [])]

    @property
    def glue_sources(self) -> list[Path]:
        return [self.cuda_dir / g for g in self.spec.cuda.glue]

    @property
    def scripted_dir(self) -> Path:
        return self.dir / self.spec.scripted.dir

    @property
    def ported_dir(self) -> Path:
        """Where the workspace keeps one CUDA file per unit."""
        return self.workspace / "targets" / self.name / "ported"

    def unit_path(self, unit: str) -> Path:
        return self.ported_dir / f"{unit}.cu"

    @property
    def fixture_script(self) -> Path | None:
        return self.dir / self.spec.fixture.script if self.spec.fixture else None

    @property
    def fixture_path(self) -> Path | None:
        return self.workspace / "runs" / "fixtures" / self.spec.fixture.file if self.spec.fixture else None

    # -- the API --
    @cached_property
    def api(self) -> list[ApiFunction]:
        return parse_api_header(self.api_header, self.symbol_prefix)

    @cached_property
    def units(self) -> list[str]:
        """API functions that are ported, in header order."""
        skip = set(self.spec.units.skip)
        return [f.name for f in self.api if f.name not in skip]

    def api_function(self, unit: str) -> ApiFunction:
        for f in self.api:
            if f.name == unit:
                return f
        raise PorterError(f"unknown unit {unit!r} for target {self.name} (see `porter units --target {self.name}`)")


def _env_source_var(name: str) -> str:
    return "PORTER_" + "".join(c if c.isalnum() else "_" for c in name.upper()) + "_SOURCE"


def read_spec(toml_path: Path) -> TargetSpec:
    """A target.toml, parsed and validated: a one-line PorterError naming `toml_path` on the first problem."""
    try:
        raw = tomllib.loads(Path(toml_path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PorterError(f"malformed {toml_path}: {exc}") from exc
    try:
        return TargetSpec.model_validate(raw)
    except ValidationError as exc:
        raise PorterError(f"malformed {toml_path}: {spec_problem(exc.errors())}") from exc


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The schema of the table at `path` ("cuda", "rules"), through optional and list fields."""
    import typing

    def model_in(tp):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
        return next((m for a in typing.get_args(tp) if (m := model_in(a)) is not None), None)

    model: type[BaseModel] | None = TargetSpec
    for part in path:
        if isinstance(part, int):
            continue  # an item of a list of tables: the list's schema
        field = model.model_fields.get(part) if model is not None else None
        model = model_in(field.annotation) if field is not None else None
    return model


def spec_problem(errors: list[dict]) -> str:
    """The first problem of a target.toml in one line.  A misspelled key says which key it probably is
    (pydantic reports a missing required key and, apart, an unknown one; or only "Extra inputs are not
    permitted" for an optional key)."""
    import difflib

    def table(loc: tuple) -> str:
        return f"[{'.'.join(str(p) for p in loc[:-1])}]" if len(loc) > 1 else "the top level"

    def dotted(loc: tuple) -> str:
        return ".".join(str(p) for p in loc)

    extra = [tuple(e["loc"]) for e in errors if e.get("type") == "extra_forbidden" and e.get("loc")]
    missing = [tuple(e["loc"]) for e in errors if e.get("type") == "missing" and e.get("loc")]
    for loc in missing:  # a required key misspelled: the unknown key beside it that is closest to it
        near = [x for x in extra if x[:-1] == loc[:-1]]
        match = difflib.get_close_matches(str(loc[-1]), [str(x[-1]) for x in near], n=1, cutoff=0.6)
        if match:
            return (f"{dotted(loc[:-1] + (match[0],))} is not a key of {table(loc)}: did you mean {loc[-1]}? "
                    f"({dotted(loc)} is required)")
    if missing:
        return f"{dotted(missing[0])} is missing: {table(missing[0])} needs it"
    if extra:
        loc = extra[0]
        model = _model_at(loc[:-1])
        known = list(model.model_fields) if model is not None else []
        match = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"did you mean {match[0]}?" if match else f"its keys are {', '.join(known)}" if known else ""
        return f"{dotted(loc)} is not a key of {table(loc)}" + (f": {hint}" if hint else "")
    first = errors[0]
    where = dotted(tuple(first.get("loc") or ()))
    return f"{where}: {first['msg']}" if where else str(first["msg"])


# Facts of one workspace rather than of its target: [sources] <target> = the checkout `porter init --source`
# was given, so the commands init suggests next work without it. Committed with the workspace.
WORKSPACE_FILE = "porter.toml"


def remembered_source(workspace: Path, name: str) -> str | None:
    path = Path(workspace) / WORKSPACE_FILE
    if not path.is_file():
        return None
    try:
        found = tomllib.loads(path.read_text()).get("sources", {}).get(name)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise PorterError(f"malformed {path}: {exc}") from exc
    return found if isinstance(found, str) and found else None


def load_target(workspace: Path, name: str, source: str | Path | None = None) -> Target:
    """Load targets/<name>/target.toml of `workspace` and resolve the source checkout.

    The checkout is, in order: `source`, $PORTER_<NAME>_SOURCE, the one `porter init --source`
    remembered in the workspace's porter.toml, the target's default_checkout (relative to its
    folder). A missing one is an error that names how to provide it.
    """
    workspace = Path(workspace).resolve()
    target_dir = workspace / "targets" / name
    toml_path = target_dir / "target.toml"
    if not toml_path.is_file():
        known = sorted(p.parent.name for p in (workspace / "targets").glob("*/target.toml"))
        raise PorterError(f"no target {name!r} in {workspace / 'targets'} (known: {', '.join(known) or 'none'})")
    spec = read_spec(toml_path)
    if spec.name != name:
        raise PorterError(f"malformed {toml_path}: name is {spec.name!r} but the folder is {name!r}")

    env_var = _env_source_var(name)
    if source is not None:
        checkout, how = Path(source), "--source"
    elif os.environ.get(env_var):
        checkout, how = Path(os.environ[env_var]), env_var
    elif remembered_source(workspace, name):
        checkout, how = Path(remembered_source(workspace, name)), f"{WORKSPACE_FILE}, remembered by porter init"
    elif spec.source.default_checkout is not None:
        checkout, how = target_dir / spec.source.default_checkout, "default_checkout"
    else:
        raise PorterError(f"target {name} needs a source checkout: pass --source DIR or set {env_var}")
    checkout = checkout.resolve()
    if not checkout.is_dir():
        raise PorterError(f"source checkout {checkout} (from {how}) does not exist: pass --source DIR or set {env_var}")
    header = checkout / spec.source.api_header
    if not header.is_file():
        raise PorterError(f"source checkout {checkout} (from {how}) has no {spec.source.api_header}")
    return Target(spec, target_dir, checkout, workspace)
