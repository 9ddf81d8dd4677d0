"""The Python <-> C seam, declared: every call lazytriton's C and C++ code makes into
lazytriton's Python, and every call Python makes into the C extensions, with what
crosses each way. `csrc/python/seam.h` spells the same C -> Python names, and the C
sources take them from there; `tests/test_seam.py` checks both lists against the
code (the names exist, take the arguments listed, and nothing crosses unlisted).

Data only: nothing here runs on a launch."""
from __future__ import annotations

from typing import NamedTuple


class Crossing(NamedTuple):
    owner: str  # the module, or module:Class, the name is looked up on
    name: str  # the attribute looked up (a call, unless `args` is None)
    args: tuple[str, ...] | None  # positional arguments, in order; None: an attribute read or write
    returns: str  # what the caller reads back
    where: str  # who crosses: the C file (C -> Python) or the Python user (Python -> C)


KERNEL = "lazytriton.runtime.kernel:LazyKernel"
ARRAYS = "lazytriton.model.arrays"

# -- C -> Python ------------------------------------------------------------------------------
# seam.h names each with a constant (kFirstCall, ...); tests/test_seam.py matches them by name.
C_TO_PYTHON = (
    Crossing(KERNEL, "_first_call", ("stub", "key", "args", "stream", "grid"),
             "True: Python launched the call itself (online tuning: a candidate timed on it); anything else: "
             "the key is resolved, the stub launches it; an exception fails the call. stub: the stub that answered "
             "(None: no stub took the call); key: its call key without a winner, or None; args: the bound call "
             "tuple; stream: int CUstream",
             "csrc/python/launcher.cc first_call"),
    Crossing(KERNEL, "_run", ("grid", "stream", "args", "kwargs"),
             "(call tuple, stream int): the call Python bound, launched through the stubs",
             "csrc/python/launcher.cc slow"),
    Crossing(KERNEL, "_fast_plan", ("nargs", "names"),
             "None: no plan yet; False: such calls always go to _run; else a tuple, per parameter after the "
             "positional ones, of an int (index into `names`) or a 1-tuple (the default value)",
             "csrc/python/launcher.cc make_plan"),
    Crossing(KERNEL, "name", None, "str: the kernel's name, in error messages", "csrc/python/launcher.cc, launch_base.cc"),
    Crossing("lazytriton.runtime.kernel", "stream_handle", ("stream",),
             "int: the CUstream of a stream= that is not an int; None: the stream rule's answer for a call "
             "with no arrays (registered once through _core.register_stream_handle, so that a replacement is "
             "noticed and called, with None too)",
             "csrc/python/launcher.cc stream_of"),
    Crossing(ARRAYS, "pointer_strategy", ("obj",), "int: how to read the device pointer of objects of this type",
             "csrc/python/array_reads.h"),
    Crossing(ARRAYS, "dtype_id", ("dtype",), "int: the dtype id (model/arrays.py DTYPE_IDS), -1 for none",
             "csrc/python/array_reads.h"),
    Crossing(ARRAYS, "is_tensor_descriptor", ("obj",), "int: 1 for a host tensor descriptor, else 0",
             "csrc/python/python_args.h"),
    Crossing(ARRAYS, "is_folded_constexpr", ("obj",), "int: 1 for a value Triton's binder folds into a constexpr",
             "csrc/python/python_args.h"),
    Crossing(ARRAYS, "constexpr_index", ("value",), "int: the index of the value in the per-process table",
             "csrc/python/python_args.h"),
    Crossing("lazytriton._generic_stub:Stub", "entry", None,
             "a stub's attribute: a PyCapsule named stub_protocol.h kStubEntryCapsule holding its StubEntry; a "
             "stub without one is a Python callable (handle, grid, stream, args) -> True launched | None other "
             "shape | the call key, unresolved", "csrc/python/launch_base.cc stub_refs_of"),
    Crossing("lazytriton.jax.ffi", "_resolve", ("payload", "buffers", "stream", "device", "capturing"),
             "int: the address of a heap std::shared_ptr<const lt::Entry> (Entry.share()) the handler takes "
             "over. buffers: ((address, bytes), ...); registered through the handler's set_resolver",
             "csrc/jax/ffi_handler.cc resolve_in_python"),
    Crossing("lazytriton.cpp.embed", "start", ("python_path", "verbose"), "None", "csrc/embed/embed.cc"),
    Crossing("lazytriton.cpp.embed", "describe", ("source",), "str: the kernel's manifest entry as JSON",
             "csrc/embed/embed.cc"),
    Crossing("lazytriton.cpp.embed", "slot_table", ("source", "types", "layouts"),
             "str: the slot table rows (JSON) of a signature with no winner yet", "csrc/embed/embed.cc"),
    Crossing("lazytriton.cpp.embed", "resolve",
             ("bundle_dir", "source", "values", "options", "grid", "stream", "layouts"),
             "(variant JSON, cubin, timer, this_call_only): the variant written into the bundle (None, False); "
             "tuning online, still deciding: this call's candidate, its _core.LaunchTimer or None, True",
             "csrc/embed/embed.cc"),
)

# -- Python -> C ------------------------------------------------------------------------------
# Everything lazytriton._core, lazytriton._generic_stub and the JAX handler module offer;
# tests/test_seam.py checks that each exists and that nothing else is offered.
CORE = "lazytriton._core"
PYTHON_TO_C = (
    Crossing(CORE, "RuntimeFailure", None, "the exception type of lt::Error", "everywhere"),
    Crossing(CORE, "driver_status", (), "(bool, str): usable, else why not", "lazytriton.gpu_available"),
    Crossing(CORE, "device_count", (), "int", "bench"),
    Crossing(CORE, "current_device", (), "int: the calling thread's current device", "runtime, cli, cpp.bundle"),
    Crossing(CORE, "pointer_device", ("ptr",), "int: the device of the memory, -1 unknown", "runtime.kernel"),
    Crossing(CORE, "pointer_accessible", ("ptr",), "bool", "runtime.kernel"),
    Crossing(CORE, "device_info", ("dev",), "dict: ordinal, name, capability, sm_count, ... backend, arch",
             "compile.targets, runtime"),
    Crossing(CORE, "synchronize", ("stream",), "None", "nothing in lazytriton (scripts)"),
    Crossing(CORE, "is_capturing", ("stream",), "bool", "nothing in lazytriton (scripts)"),
    Crossing(CORE, "exchange_capture_mode", ("mode",), "int: the previous mode", "jax.ffi"),
    Crossing(CORE, "CAPTURE_MODE_RELAXED", None, "int", "jax.ffi"),
    Crossing(CORE, "slot_bits", ("value", "row", "what"), "int: the parameter bytes in a u64", "runtime.fixed"),
    Crossing(CORE, "counters", (), "dict: launches, module_loads, bench_launches, resolves, scratch_allocs",
             "runtime.kernel.stats"),
    Crossing(CORE, "launch_meta_from_json", ("text",), "dict: LaunchMeta as bundles read it (tests)", "tests"),
    Crossing(CORE, "check_fits", ("meta", "dev"), "str: '' or why the kernel does not fit", "runtime.tuner"),
    Crossing(CORE, "check_tensor_desc", ("desc",), "str: '' or why it cannot be a descriptor argument",
             "model.tensor_desc, jax.call"),
    Crossing(CORE, "pack_tensor_desc", ("metadata", "index", "desc", "kernel", "arg"), "list of bytes", "tests"),
    Crossing(CORE, "set_torch_reader", ("capsule",), "None", "runtime.torch_reader"),
    Crossing(CORE, "torch_reader_installed", (), "bool", "runtime.torch_reader"),
    Crossing(CORE, "_readers", None, "PyCapsule (stub_protocol.h kReadersCapsule) the stubs read arrays through",
             "generated stubs, _generic_stub"),
    Crossing(CORE, "register_stream_handle", ("fn",), "None", "runtime.kernel"),
    Crossing(CORE, "default_stream", ("args",), "int: the CUstream a call of these arguments launches on when it "
             "names none (torch's current stream, CuPy's, or 0: csrc/python/launcher.cc default_stream)",
             "runtime.kernel"),
    Crossing(CORE, "Kernel", ("cubin", "metadata"), "a loaded-on-use kernel: .name .metadata .cubin .load()",
             "runtime, jax, cpp"),
    Crossing(CORE, "Entry", ("kernel", "is_param", "meta", "grid", "sources", "zero", "timer", "once"),
             "a resolved launch: .share() -> int address (for the JAX handler), .grid .sources .kernel .meta "
             ".is_param .timer .once (a one-call entry of online tuning: never installed)",
             "runtime.resolve, runtime.fixed, runtime.tuner, jax.ffi"),
    Crossing(CORE, "LaunchTimer", (), "two CUDA events around one launch: .arm() (the thread's next launch is "
             "timed, by Kernel::launch) .disarm() .elapsed_ms() -> float | None (never waits) .launched .done "
             ".failure (a launch of it failed in C++)",
             "runtime.online, runtime.kernel, jax.ffi"),
    Crossing(CORE, "CallSite", ("name", "n_buffers", "resolver"), "the fixed-layout call site the JAX handler "
             "launches through (call_site.h), its resolver a Python callable (key) -> Entry: .launch(stream, "
             "buffers) .resolved", "tests"),
    Crossing(CORE, "ResolveTable", ("name",), "the resolve-once table: .handle (int address, written into "
             "LaunchBase._handle and read by the stubs) .claim(key) -> None | Claim .install .find .clear",
             "runtime.kernel"),
    Crossing(CORE, "Claim", None, "from ResolveTable.claim: .publish(entry) .release(); a context manager",
             "runtime.kernel"),
    Crossing(CORE, "ScratchArena", (), "scratch memory of one launch site", "tests"),
    Crossing(CORE, "launch_fixed", ("entry", "stream", "buffers", "arena"), "None", "tests, bench"),
    Crossing(CORE, "LaunchBase", None, "LazyKernel's C base: attribute writes below build what C reads",
             "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_stubs", None, "write a tuple of stubs: C reads each one's `entry` capsule",
             "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_handle", None, "write ResolveTable.handle (an int address) or 0",
             "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_n_call", None, "write int: parameters of a bound call", "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_python_heuristics", None, "write bool: every call goes to _run",
             "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_needs_probe", None, "write bool: the next call goes to _run", "runtime.kernel"),
    Crossing(CORE + ":LaunchBase", "_launch_plans", None, "read: the cached keyword plans (tests)", "tests"),
    Crossing(CORE + ":LaunchBase", "run", ("grid",), "a Launch (k[grid] is the same)", "users"),
    Crossing(CORE, "Launch", None, "k[grid]: calling it launches, in C", "users"),
    Crossing(CORE, "Snapshot", ("stream", "buffers"), "buffers saved for a tuning trial: .restore(stream)",
             "runtime.tuner"),
    Crossing(CORE, "bench", ("entry", "stream", "buffers", "snapshot", "zero", "options"),
             "dict: one candidate's timed launches", "runtime.tuner"),
    Crossing(CORE, "bench_interleaved", ("entries", "stream", "buffers", "snapshot", "zero", "options"),
             "list of dict: per-candidate times, trials interleaved", "runtime.tuner"),
    Crossing(CORE, "raw_launch_loop", ("entry", "stream", "buffers", "n"), "float: a launch loop timed (the harness)",
             "bench"),
    Crossing(CORE, "core_launch_loop", ("entry", "stream", "buffers", "n"),
             "float: a launch loop timed (the harness)", "bench"),
    Crossing(CORE, "zero", ("stream", "ptr", "nbytes"), "None", "runtime.tuner"),
    Crossing(CORE, "allocation_extent", ("ptr",), "int: bytes of the allocation from ptr on", "cpp.embed"),
    Crossing(CORE, "ipc_export", ("ptr",), "(64-byte handle | None, offset, why): the allocation holding ptr, "
             "exported for CUDA IPC", "runtime.isolation"),
    Crossing(CORE, "DeviceCopies", ("stream", "buffers"), "exportable device copies of (address, nbytes) "
             "buffers: .addresses", "runtime.isolation"),
    Crossing(CORE, "copy_to_host", ("stream", "ptr", "nbytes", "out"), "None: device bytes into a writable buffer",
             "runtime.isolation"),
    Crossing(CORE, "use_device", ("device",), "None: the device's primary context made current",
             "runtime.isolation_helper"),
    Crossing(CORE, "TrialBuffers", ("stream", "sources"), "the isolation helper's copies of a call's buffers: "
             ".addresses .device_bytes", "runtime.isolation_helper"),
    Crossing(CORE, "launch_and_wait", ("entry", "stream", "buffers"),
             "str: '' when the launch ran clean, else the driver's error name", "runtime.isolation_helper"),
    Crossing(CORE, "flush_l2", ("stream",), "None", "nothing in lazytriton (scripts)"),
    Crossing(CORE, "reserve_l2_flush", (), "int: bytes of the L2 flush buffer", "runtime.tuner"),
    Crossing("lazytriton._generic_stub", "Stub", None,
             "the table-driven stub, made from Shape.table(): .entry (capsule) .key(args) .params(args) "
             ".launch(...) .key_words", "runtime.stubgen"),
    Crossing("lt_stub_<digest>", "entry", None, "a generated stub module (stubgen.py writes it): .entry .key "
             ".params .launch, as Stub", "runtime.stubgen"),
    Crossing("jax handler", "handlers", (), "{'instantiate': capsule, 'execute': capsule}", "jax.ffi"),
    Crossing("jax handler", "state_type", (), "{'type_id': capsule, 'type_info': capsule}", "jax.ffi"),
    Crossing("jax handler", "set_resolver", ("fn",), "None: fn is C_TO_PYTHON's lazytriton.jax.ffi._resolve",
             "jax.ffi"),
    Crossing("jax handler", "site_count", (), "(sites, resolved launches, executions, unshared aliases copied)",
             "jax.ffi.handler_stats"),
)
