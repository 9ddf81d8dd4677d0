// The Python <-> C seam, declared: every name lazytriton's C and C++ code looks up
// in lazytriton's Python, with what it passes and reads back. The C sources take
// these names from here, never as string literals of their own; the Python side of
// the list, and every call Python makes into the C extensions, is
// lazytriton/runtime/seam.py (tests/test_seam.py checks that the two agree).
//
// No Python headers: the launcher, the stubs (built at run time: installed beside
// the package), the JAX handler and the C++ embedding all include it.
#pragma once

namespace lt::seam {

// -- LazyKernel (lazytriton/runtime/kernel.py), called by csrc/python/launcher.cc -----------
inline constexpr char kKernelModule[] = "lazytriton.runtime.kernel";
// k._first_call(stub | None, key | None, args: tuple, stream: int, grid) -> ignored
// (an exception fails the call): the one crossing of a call no stub can launch yet.
inline constexpr char kFirstCall[] = "_first_call";
// k._run(grid, stream, args: tuple, kwargs: dict) -> (call: tuple, stream: int).
inline constexpr char kRun[] = "_run";
// k._fast_plan(nargs: int, names: tuple[str]) -> None (no plan yet) | False (never)
// | tuple, per parameter after the positional ones: int (index into names) or a
// 1-tuple (the default value).
inline constexpr char kFastPlan[] = "_fast_plan";
// k.name -> str (error messages; also read by launch_base.cc).
inline constexpr char kKernelName[] = "name";
// lazytriton.runtime.kernel.stream_handle(stream) -> int CUstream.
inline constexpr char kStreamHandle[] = "stream_handle";

// -- lazytriton/model/arrays.py, asked by array_reads.h and python_args.h --------------------
inline constexpr char kArraysModule[] = "lazytriton.model.arrays";
inline constexpr char kPointerStrategy[] = "pointer_strategy";          // (obj) -> int, once per type
inline constexpr char kDtypeId[] = "dtype_id";                          // (dtype | typestr) -> int, -1: none
inline constexpr char kIsTensorDescriptor[] = "is_tensor_descriptor";  // (obj) -> 0 | 1, once per type
inline constexpr char kIsFoldedConstexpr[] = "is_folded_constexpr";    // (obj) -> 0 | 1, once per type
inline constexpr char kConstexprIndex[] = "constexpr_index";           // (value) -> int, once per value

// -- a launch stub (runtime/stubgen.py, _generic_stub), read by launch_base.cc ---------------
// stub.entry -> PyCapsule named stub_protocol.h kStubEntryCapsule (its StubEntry); a
// stub without one is a Python callable (handle, grid, stream: int, args: tuple) ->
// True (launched) | None (another shape) | the call key (no winner yet).
inline constexpr char kStubEntry[] = "entry";

// -- the JAX handler (csrc/jax/ffi_handler.cc) -------------------------------------------------
// The resolver Python registers with the handler's set_resolver (lazytriton.jax.ffi._resolve):
// (payload: str, buffers: ((address, bytes), ...), stream: int, device: int,
// capturing: bool) -> int, the address of a heap std::shared_ptr<const lt::Entry>
// (_core.Entry.share()) the handler takes over. Passed as an object: no name.

// -- lazy mode (csrc/embed/embed.cc) ----------------------------------------------------------
inline constexpr char kEmbedModule[] = "lazytriton.cpp.embed";
inline constexpr char kEmbedStart[] = "start";        // (python_path: list, verbose: bool) -> None
inline constexpr char kEmbedDescribe[] = "describe";  // (source) -> str: the kernel's manifest entry (JSON)
// (source, types, layouts) -> str: the slot table of a signature with no winner yet (JSON rows)
inline constexpr char kEmbedSlotTable[] = "slot_table";
// (bundle_dir, source, values, options, grid, stream, layouts) -> (str, str): the variant written
inline constexpr char kEmbedResolve[] = "resolve";

}  // namespace lt::seam
