"""The parity child: loads a candidate backend library and runs one plan on it.

    python child.py PLAN_DIR

The one entry point of both kinds of plan: run_plan opens the device, loads the
library (loader.py, the only module that loads one) and hands each case to the
plan's kind -- OpCalls here (one call of an op unit per pass), or
scenario_child.ScenarioCalls (a runtime unit's sequence of API calls).

Runs in its own process (porter.gates.parity.runner starts it with a time
limit), so a hang, a segfault or a dead CUDA context costs one failed attempt,
never the harness.  It imports numpy, ctypes, cupy and its siblings
(device.py, compare.py, loader.py) by file path: nothing of porter, pydantic or gguf.

PLAN_DIR/plan.json says what to call (see runner.write_plan); PLAN_DIR/inputs.npz
holds every input of every call.  An op plan runs beside the checker
(checker.py), which owns every buffer the unit is called on: this process
maps the checker's arena, calls the unit and tells the checker where it is
(prepared / called / settled; put / timed for timed calls).  It writes, as it goes:
  progress.jsonl  one line before each step (so a crash names its case and step)
  results.json    what only this process can observe, as claims the parent
                  validates: return codes, CUDA errors left, descriptor changes,
                  the stream probe, the host map's bytes, event times
It reads no output, guard or const input for a verdict: the checker does, and
the parent compares.  This process loads the candidate, so anything it says can
be forged; the parent only takes its words as refusals or as numbers the
checker's own measurements bound.

Per call (a "pass"; every valid case runs two passes in the SAME buffers with
different inputs):
  1. the checker writes the inputs and fills the outputs with the sentinel (a
     NaN bit pattern); the model map is a fresh host buffer,
     mini_cuda_forget_models() is called and the map is uploaded again;
  2. on one pass per case, drawn at random here (and on the next pass too when
     that probe was inconclusive), the unit's stream (target.toml's [cuda] stream) is
     held by a timed spin kernel, the unit is called, and while the hold lasts
     the outputs are read on an unrelated non-blocking stream: a unit that
     orders its work on its stream cannot have written anything yet;
  3. the unit's stream is synchronized and the checker reads the outputs; then
     the whole device is synchronized and the checker reads them again: a
     difference means work landed after the unit's stream said it was done;
  4. descriptors and the host map are compared with what they were here; the
     checker compares guard bytes and const inputs in its own memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (sibling module, loaded by path on purpose)
import device as devmod  # noqa: E402
import link as linkmod  # noqa: E402
import loader  # noqa: E402
import shared_mem  # noqa: E402
from loader import Fatal, Tensor  # noqa: E402

EXIT_DONE, EXIT_BAD_PLAN, EXIT_CUDA, EXIT_LOAD = 0, 2, 3, 4

_CTYPES = {
    "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
    "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool,
}


class PlanRun:
    """One plan in this process, whatever its kind: its files, the device, the loaded library."""

    def __init__(self, plan_dir: Path, plan: dict):
        self.dir = plan_dir
        self.plan = plan
        self.progress = open(plan_dir / "progress.jsonl", "a", buffering=1)
        self.results: dict = {"cases": [], "fatal": None, "complete": False, "device": None}
        self.outputs: dict[str, np.ndarray] = {}
        # opened before the candidate loads: its socket is then the only way to the checker
        self.link = linkmod.Link.from_env() if plan.get("kind") != "scenario" else None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Seconds per phase of this child (results["phase_s"]): where a verdict's time goes."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            acc = self.results.setdefault("phase_s", {})
            acc[name] = round(acc.get(name, 0.0) + time.perf_counter() - t0, 4)

    def step(self, **fields) -> None:
        self.progress.write(json.dumps(fields) + "\n")
        self.progress.flush()

    def save(self) -> None:
        tmp = self.dir / "results.json.tmp"
        tmp.write_text(json.dumps(self.results))
        os.replace(tmp, self.dir / "results.json")

    def save_outputs(self) -> None:
        np.savez(self.dir / "outputs.npz", **self.outputs)

    def run(self, kind, dev=None) -> int:
        """kind: the plan's calls (OpCalls, ScenarioCalls); dev: a device a warm worker already
        opened (worker.py), None: open one now."""
        plan = self.plan
        try:
            self.dev = dev if dev is not None else devmod.make_device(plan["mode"])
            with self.phase("device"):
                self.results["device"] = self.dev.facts()
            with self.phase("load"):
                self.step(step="load", library=plan["library"])
                self.lib = loader.load(plan["library"])
                calls = kind(self)
            with self.phase("inputs"):
                arrays = np.load(self.dir / "inputs.npz")
            for case in plan["cases"]:
                calls.run_case(case, arrays)
                self.save()
                if calls.outputs_each_case:  # what earlier cases wrote survives a crash in a later one
                    self.save_outputs()
            self.results["complete"] = True
            calls.finish()
            return EXIT_DONE
        except Fatal as exc:
            self.results["fatal"] = {"check": exc.check, "detail": exc.detail, "at": self._last_step()}
            return EXIT_LOAD if exc.check == "load" else EXIT_CUDA
        except devmod.DeviceError as exc:
            self.results["fatal"] = {"check": "cuda-error", "detail": str(exc), "at": self._last_step()}
            return EXIT_CUDA
        except (linkmod.LinkClosed, shared_mem.ArenaError) as exc:
            self.results["fatal"] = {"check": "crash", "detail": f"checker link: {exc}", "at": self._last_step()}
            return EXIT_CUDA
        finally:
            try:
                with self.phase("outputs"):
                    self.save_outputs()
            except Exception:  # noqa: BLE001 - outputs are best effort after a fatal error
                pass
            self.save()  # after the outputs, so that their time is in phase_s
            self.progress.close()

    def _last_step(self):
        try:
            lines = (self.dir / "progress.jsonl").read_text().splitlines()
            return json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            return None


class OpCalls:
    """An op unit's plan: every case calls the unit once per pass on fenced device buffers."""

    outputs_each_case = False

    def __init__(self, run: PlanRun):
        self.dev, self.plan, self.results, self.outputs = run.dev, run.plan, run.results, run.outputs
        self.step, self.phase, self.save = run.step, run.phase, run.save
        self._flags: list = []  # host bools handed to `bool *` parameters
        self._live_map = None  # see _keep_map
        lib, plan = run.lib, self.plan
        argtypes = []
        for p in plan["params"]:
            k = p["kind"]
            if k == "tensor":
                argtypes.append(ctypes.POINTER(Tensor))
            elif k in ("map", "flag"):
                argtypes.append(ctypes.c_void_p)
            else:
                argtypes.append(_CTYPES[k])
        self.fn = loader.function(lib, plan["unit"], ctypes.c_int if plan.get("restype", "int") == "int" else None,
                                  argtypes, required=True)
        h = plan.get("harness", {})
        self.h_model = loader.function(lib, h.get("model_ptr"), ctypes.c_void_p,
                                       [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64])
        self.h_forget = loader.function(lib, h.get("forget_models"), None, [])
        self.launch_error = loader.cuda_errors(lib)
        init = loader.function(lib, h.get("init"), ctypes.c_int, [])
        if init is not None:
            self.step(step="init")
            self.results["init_rc"] = int(init())
        self.stream = loader.unit_stream(lib, h)  # None: no stream probe (e.g. the host stand-in)
        if self.stream is not None:
            self.results["unit_stream"] = hex(self.stream)
        self.link = run.link
        if self.link is None:
            raise Fatal("checker", "no checker to run beside (op plans need one: $PORTER_CHECKER_FD)")

    def finish(self) -> None:
        self._forget_last_map()
        self.link.ask({"op": "done"})

    # -- one case ----------------------------------------------------------
    def run_case(self, case: dict, arrays) -> dict:
        plan = self.plan
        crec = {"id": case["id"], "passes": []}
        self.results["cases"].append(crec)
        self.step(case=case["id"], step="buffers")
        reply, fds = self.link.ask({"op": "case", "case": case["id"]})
        if len(fds) != 1:
            raise Fatal("checker", f"the checker sent {len(fds)} descriptors for case {case['id']}")
        arena = shared_mem.make_arena(self.dev.kind, int(reply["size"]), self.dev, loader, fds[0])
        bufs = {name: _Shared(arena.base + int(reply["offsets"][name]), int(b["nbytes"]))
                for name, b in case["buffers"].items()}
        structs = {name: Tensor(*_descriptor(case, name, buf), 0) for name, buf in bufs.items()}
        probe_cfg = plan.get("probe") or {}
        probing = bool(probe_cfg.get("enabled")) and self.stream is not None
        # one pass per case is probed, drawn here where the candidate cannot know it: a unit that
        # orders its work right on some calls only is caught with odds 1/2 per case
        watched_pass = None if probe_cfg.get("every_pass") else random.SystemRandom().randrange(
            max(1, len(case["passes"])))
        retry = False
        for p, pdata in enumerate(case["passes"]):
            hold_ms = None
            if probing and (retry or watched_pass in (None, p)):
                hold = probe_cfg.get("hold_ms", 15)
                hold_ms = probe_cfg.get("retry_hold_ms", 4 * hold) if retry else hold
            with self.phase("passes"):
                rec = self.run_pass(case, p, pdata, arrays, bufs, structs, hold_ms)
            crec["passes"].append(rec)
            # a call slower than the hold proves nothing either way: the next pass is probed, longer
            retry = (rec.get("probe") or {}).get("status") == "inconclusive"
            with self.phase("save"):
                self.save()
        if case.get("timed") and int(plan.get("timing_reps", 0)) > 0 and case["expect"] == "ok":
            with self.phase("timing"):
                crec["timing"] = self.time_case(case, arrays, structs, bufs)
        self.dev.synchronize()
        return crec

    def _map_for(self, pdata, arrays):
        m = pdata.get("map")
        if m is None:
            return None
        if "file" in m:
            return np.fromfile(m["file"], dtype=np.uint8)  # a fresh host buffer every call
        return np.array(arrays[m["npz"]], dtype=np.uint8, copy=True)

    def _keep_map(self, host_map) -> None:
        """Hold the host map handed to this call until the next call's forget hook has run.
        A backend keeps the map registered (cudaHostRegister) between calls, as ds4's engine keeps
        its mmap alive; freeing the buffer first hands the next forget a registration over freed,
        possibly unmapped, pages, and its cudaHostUnregister leaves cudaErrorInvalidValue behind
        for the next call to be blamed for."""
        self._live_map = host_map

    def _forget_last_map(self) -> None:
        """After the last call: the backend drops its registration of the last map before the
        buffer is freed.  A warm worker runs the next job in this process, and a registration left
        over freed pages makes that job's copies from reused addresses fail (cudaErrorInvalidValue
        blamed on an innocent unit).  A job that ends otherwise retires the worker (worker.py)."""
        if self._live_map is not None and self.h_forget is not None:
            self.h_forget()
        self._live_map = None

    def _args(self, case, pdata, structs, host_map):
        args = []
        for p in self.plan["params"]:
            k, name = p["kind"], p["name"]
            if k == "tensor":  # bound to no buffer: an error case's NULL tensor
                b = case["bind"][name]
                args.append(ctypes.POINTER(Tensor)() if b is None else ctypes.byref(structs[b]))
            elif k == "map":
                args.append(ctypes.c_void_p(host_map.ctypes.data if host_map is not None else None))
            elif k == "flag":  # a `bool *` out-flag: a fresh host bool, false before the call
                flag = ctypes.c_bool(False)
                self._flags.append(flag)  # alive until the child ends
                args.append(ctypes.c_void_p(ctypes.addressof(flag)))
            else:
                args.append(_CTYPES[k](pdata["scalars"][name]))
        return args

    def _sync_unit_stream(self) -> None:
        if self.dev.kind == "cuda":
            self.dev.sync_stream(self.stream or 0)

    def run_pass(self, case, p, pdata, arrays, bufs, structs, hold_ms: float | None) -> dict:
        """One call of the unit; hold_ms: the stream probe's hold for this pass (None: no probe)."""
        dev, plan = self.dev, self.plan
        cid = case["id"]
        rec: dict = {"pass": p}
        self.step(case=cid, pass_=p, step="prepare")
        self.link.ask({"op": "prepare", "case": cid, "pass": p})
        for name, s in structs.items():  # a previous call may have rewritten a descriptor
            (s.data, s.bytes), s.owner = _descriptor(case, name, bufs[name]), 0
        host_map = self._map_for(pdata, arrays)
        map_bytes = host_map.tobytes() if host_map is not None else None
        if self.h_forget is not None:
            self.h_forget()
        self._keep_map(host_map)
        dev_map = None
        if host_map is not None and self.h_model is not None:
            dev_map = self.h_model(host_map.ctypes.data, host_map.size, 0, host_map.size)
            rec["model_uploaded"] = bool(dev_map)
        args = self._args(case, pdata, structs, host_map)
        before_structs = {n: (s.data, s.bytes, s.owner) for n, s in structs.items()}
        dev.synchronize()

        probe_cfg = plan.get("probe") or {}
        token = None
        outs = case["outputs"]  # compared param -> buffer
        watched = sorted({b for b in outs.values()} | {n for n, b in case["buffers"].items() if b["role"] != "in"})
        if hold_ms is not None:
            initial = {n: self._initial(case, pdata, arrays, n) for n in watched}
            dev.reserve(max([bufs[n].nbytes for n in watched] + [0]))
            token = dev.hold(self.stream, int(hold_ms * 1e6))
        self.step(case=cid, pass_=p, step="call")
        t0 = time.perf_counter()
        rc = self.fn(*args)
        rec["call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        rec["rc"] = None if rc is None else int(rc)
        rec["launch_error"] = self.launch_error()

        if token is not None:
            self.step(case=cid, pass_=p, step="probe")
            probe = {"status": "inconclusive", "changed": []}
            devmod.sleep_ms(float(probe_cfg.get("delay_ms", 5)))
            if dev.held(token):
                snap = {n: dev.read_side(bufs[n].ptr, bufs[n].nbytes) for n in watched}
                if dev.held(token):
                    probe["changed"] = [n for n in watched if snap[n] != initial[n]]
                    probe["status"] = "changed" if probe["changed"] else "clean"
                else:
                    probe["note"] = "the hold ended during the probe read"
            else:
                probe["note"] = "the call returned after the hold ended (it waits on its stream)"
            dev.release(token)
            rec["probe"] = probe
        self.step(case=cid, pass_=p, step="sync")
        self._sync_unit_stream()
        self.link.ask({"op": "called", "case": cid, "pass": p})  # the checker reads the outputs now
        dev.synchronize()
        self.step(case=cid, pass_=p, step="check")
        self.link.ask({"op": "settled", "case": cid, "pass": p})  # ... and again, with guards and const inputs
        rec["struct_changed"] = [
            {"tensor": n, "before": list(before_structs[n]), "after": [s.data, s.bytes, s.owner]}
            for n, s in structs.items() if (s.data, s.bytes, s.owner) != before_structs[n]
        ]
        const = []
        if host_map is not None:
            if host_map.tobytes() != map_bytes:
                n_diff, first = compare.byte_diff(map_bytes, host_map.tobytes())
                const.append({"tensor": "model_map (host)", "n_bytes": n_diff, "first": first})
            if dev_map:
                again = self.h_model(host_map.ctypes.data, host_map.size, 0, host_map.size)
                if again:
                    got = dev.read(again, host_map.size)
                    if got != map_bytes:
                        n_diff, first = compare.byte_diff(map_bytes, got)
                        const.append({"tensor": "model_map (device copy)", "n_bytes": n_diff, "first": first})
        rec["const_changed"] = const
        return rec

    @staticmethod
    def _initial(case, pdata, arrays, name) -> bytes:
        """What the checker wrote into a buffer before the call (the stream probe's baseline)."""
        b = case["buffers"][name]
        if b["role"] == "out":
            return compare.sentinel_bytes(b["nbytes"])
        return np.ascontiguousarray(arrays[pdata["data"][name]]).view(np.uint8).tobytes()

    def time_case(self, case, arrays, structs, bufs) -> dict:
        """Time the unit on rotating input sets (plan: timing_sets, and timing_order, the set of each
        repetition; a repetition never gets the inputs of the call before it, so replaying the last
        answer is useless).  Per repetition: the set's weights are loaded (forget + model hook: the
        target's regime), one untimed warm call runs on those weights with ANOTHER set's inputs (lazy
        caches built outside the timed call), the checker writes the set into the buffers (outputs to
        the sentinel) and flushes L2, persisting L2 lines are reset here, and the call alone is timed by
        events on the unit's stream while the checker times the whole exchange from outside; then the
        device is synchronized and how long that took (the tail: work left past the end event) recorded.
        The checker reads the outputs of repetitions it chose, right after the end event and again after
        the device synchronize.  Only raw facts leave this process; the parent computes the statistics."""
        dev, cid = self.dev, case["id"]
        sets = case.get("timing_sets") or [case["passes"][-1]]
        reps = int(self.plan.get("timing_reps", 10))
        order = case.get("timing_order") or [len(sets) - 1] * reps
        reps = len(order)
        stream = self.stream or 0

        def put(k_inputs: int) -> None:
            for name, st in structs.items():  # a call may have rewritten a descriptor
                (st.data, st.bytes), st.owner = _descriptor(case, name, bufs[name]), 0
            self.link.ask({"op": "put", "case": cid, "set": k_inputs})

        loaded, host_map = None, None

        def load(k: int):
            nonlocal loaded, host_map
            if loaded == k:
                return
            if self.h_forget is not None:
                self.h_forget()
            host_map = self._map_for(sets[k], arrays)
            self._keep_map(host_map)
            if host_map is not None and self.h_model is not None:
                self.h_model(host_map.ctypes.data, host_map.size, 0, host_map.size)
            loaded = k

        self.step(case=cid, step="timing")
        times, tails, reset = [], [], True
        for r, k in enumerate(order):
            load(k)
            args = self._args(case, sets[k], structs, host_map)
            put(order[r - 1] if r and order[r - 1] != k else (k + 1) % len(sets))  # the warm call's inputs
            self.fn(*args)
            dev.synchronize()
            put(k)
            reset = dev.reset_persisting_l2(stream) and reset
            dev.synchronize()
            self.link.ask({"op": "timed", "case": cid, "rep": r})
            ms = dev.time_one(lambda: self.fn(*args), stream)
            self.link.ask({"op": "timed_end", "case": cid, "rep": r, "ms": ms})
            t0 = time.perf_counter()
            dev.synchronize()
            tails.append((time.perf_counter() - t0) * 1e3)
            self.link.ask({"op": "timed_settled", "case": cid, "rep": r})
            times.append(ms)
        dev.synchronize()
        return {"reps": reps, "times_ms": times, "tail_ms": tails, "sets": len(sets),
                "l2_flushed": dev.kind == "cuda", "l2_persisting_reset": dev.kind == "cuda" and reset,
                "clock": "cuda-events" if dev.kind == "cuda" else "host"}


class _Shared:
    """A buffer in the checker's arena, as this process sees it."""

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes


def _descriptor(case: dict, name: str, buf: _Shared) -> tuple[int | None, int]:
    """(data, bytes) the unit's descriptor of buffer `name` holds before each call: the buffer itself,
    or what an error case's plan says instead (a NULL data pointer, fewer bytes than the buffer has;
    the buffer stays full size, so a unit that ignores the claim writes into memory the checker owns)."""
    b = case["buffers"][name]
    data = None if b.get("data_null") else buf.ptr
    claim = b.get("claim_bytes")
    return data, (int(claim) if claim is not None else buf.nbytes)


def call_only(plan_dir: Path, plan: dict) -> int:
    """mode "call": load a library and call one `int f(void)` symbol (tests of the runner)."""
    (plan_dir / "progress.jsonl").write_text(json.dumps({"step": "call", "symbol": plan["symbol"]}) + "\n")
    rc = loader.function(loader.load(plan["library"]), plan["symbol"], ctypes.c_int, [], required=True)()
    (plan_dir / "results.json").write_text(json.dumps({"complete": True, "rc": rc}))
    return EXIT_DONE


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: child.py PLAN_DIR", file=sys.stderr)
        return EXIT_BAD_PLAN
    return run_plan(Path(argv[1]))


def run_plan(plan_dir: Path, dev=None, library: str | None = None) -> int:
    """One plan, in this process: the fresh child's main, and each job of a warm worker
    (which passes its open device and a private copy of the library, see worker.py)."""
    try:
        plan = json.loads((plan_dir / "plan.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"parity child: unreadable plan: {exc}", file=sys.stderr)
        return EXIT_BAD_PLAN
    if library:
        plan["library"] = library
    # a known-good variant's knobs, read by the library (often once, into a static) when it runs:
    # set before it loads; a warm worker puts its own environment back after the job
    os.environ.update(plan.get("env") or {})
    if plan.get("mode") == "call":
        return call_only(plan_dir, plan)
    if plan.get("kind") == "scenario":  # a runtime unit's sequence of calls (scenario_child.py, by path)
        from scenario_child import ScenarioCalls as kind
    else:
        kind = OpCalls
    try:
        return PlanRun(plan_dir, plan).run(kind, dev)
    except Exception:  # noqa: BLE001 - a harness bug: say so on stderr, exit distinctly
        traceback.print_exc()
        return 5


if __name__ == "__main__":
    sys.exit(main(sys.argv))
