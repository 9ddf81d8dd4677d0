// A stand-in libcuda.so.1 for CPU-only tests (tests/test_launch_bytes.py): every
// call succeeds on made-up handles, and the two calls whose inputs matter are
// recorded, so that the bytes a launch would hand the GPU can be compared with
// what Triton's own launcher hands it, on a machine with no GPU.
//   cuTensorMapEncodeTiled: its arguments are written into the 128-byte map
//     itself (type, rank, interleave, swizzle, L2 promotion, OOB fill, address,
//     rank dims, rank - 1 byte strides, rank box dims, rank element strides).
//   cuLaunchKernelEx / cuLaunchKernel: one JSON line appended to $FAKE_CUDA_LOG
//     with the grid, block, shared bytes and every parameter's bytes in hex;
//     parameter sizes come from the cubin itself (its .nv.info.<kernel> section's
//     KPARAM_INFO records: what the GPU would read), else from $FAKE_CUDA_PARAM_SIZES
//     ("kernel:8,128,4;other:8"); "image" is a hash of the cubin the function came
//     from, so a test can tell which compiled specialization was launched.
//     The isolation helper's launches are left out unless $FAKE_CUDA_LOG_HELPER=1.
//     $FAKE_CUDA_LOG=discard records nothing (each launch only succeeds): for
//     timing the host path on a machine with no GPU (benchmarks/launch_path_cpu.py).
// Device: one sm_90 GPU ("FAKE sm_90"; $FAKE_CUDA_CC=80 makes it sm_80). Memory calls hand out
// addresses nothing reads. Contexts are per thread, as the driver's: none is current on a thread
// until cuCtxSetCurrent, and cuTensorMapEncodeTiled refuses a thread without one.
// $FAKE_CUDA_DEVICES=2 adds a second device: each device has its primary context, and the
// addresses 0x7a0000000000-0x7affffffffff are device 1's memory, every other address device 0's
// (a thread with no current context launches on device 0).
// Faults, as a real context has them: $FAKE_CUDA_FAULT_BLOCK=256 (or a list: 64,256) makes a launch of
// 256 threads per block an illegal address: it and every later launch and synchronization of the process answer
// CUDA_ERROR_ILLEGAL_ADDRESS (700), as a dead context does; $FAKE_CUDA_HANG_BLOCK=256 makes such a
// launch never finish (the next synchronization blocks forever).
// CUDA IPC: cuIpcGetMemHandle writes the allocation's address into the handle and cuIpcOpenMemHandle
// maps it at that same address; addresses 0x7c0000000000-0x7cffffffffff (stream-ordered pool
// memory, say) are not exportable (IS_LEGACY_CUDA_IPC_CAPABLE 0, export CUDA_ERROR_INVALID_VALUE), and
// $FAKE_CUDA_IPC=0 makes no memory exportable.
// cuPointerGetAttribute answers their device (DEVICE_ORDINAL) and, as without peer access,
// refuses DEVICE_POINTER for memory of another device than the current context's
// (CUDA_ERROR_INVALID_VALUE), unless $FAKE_CUDA_PEER_ACCESS=1. A launch's record says on which
// device it ran ("device").
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUstream;
typedef void* CUevent;

typedef struct {
  uint64_t hash;  // FNV-1a of the image
  const unsigned char* image;  // a copy (the caller may free its own)
  size_t size;
} FakeModule;

#define MAX_PARAMS 512
typedef struct {
  char name[256];
  uint64_t image_hash;
  int n_params;  // -1: the cubin did not say (then $FAKE_CUDA_PARAM_SIZES)
  int param_sizes[MAX_PARAMS];
} FakeFunction;

typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  void* attrs;
  unsigned numAttrs;
} FakeLaunchConfig;  // CUlaunchConfig's layout

#define MAX_DEVICES 8
static int g_ctx_tokens[MAX_DEVICES];
static __thread CUcontext g_current;  // NULL: none set on this thread (launches go to device 0)

static int n_devices(void) {
  static int count;  // read once: a launch asks (through cuPointerGetAttribute)
  if (!count) {
    const char* n = getenv("FAKE_CUDA_DEVICES");
    int v = n ? atoi(n) : 1;
    count = v < 1 ? 1 : v > MAX_DEVICES ? MAX_DEVICES : v;
  }
  return count;
}
static CUcontext current_ctx(void) { return g_current ? g_current : (CUcontext)&g_ctx_tokens[0]; }
static int current_device(void) { return (int)((int*)current_ctx() - g_ctx_tokens); }
static int device_of_address(CUdeviceptr p) { return (p >> 40) == 0x7a && n_devices() > 1 ? 1 : 0; }
static CUdeviceptr g_next_alloc = 0x7e0000000000ull;

#define OK return 0

// Whether this process is lazytriton's isolation helper (runtime/isolation_helper.py), which launches
// each candidate once before the caller does: its launches are recorded only with $FAKE_CUDA_LOG_HELPER=1,
// so that a log holds the launches of the process under test (and its helpers' where a test asks).
static int is_isolation_helper(void) {
  static int helper = -1;
  if (helper < 0) {
    char cmdline[4096] = {0};
    FILE* f = fopen("/proc/self/cmdline", "rb");
    size_t n = f ? fread(cmdline, 1, sizeof(cmdline) - 1, f) : 0;
    if (f) fclose(f);
    for (size_t i = 0; i < n; ++i)
      if (!cmdline[i]) cmdline[i] = ' ';
    helper = strstr(cmdline, "isolation_helper.py") != NULL;
  }
  return helper;
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  const char* none = getenv("FAKE_CUDA_HELPER_NO_DEVICE");  // the helper finds no device (its start fails)
  return none && *none == '1' && is_isolation_helper() ? 100 : 0;  // CUDA_ERROR_NO_DEVICE
}
CUresult cuDriverGetVersion(int* v) { *v = 13020; OK; }
CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == 700 ? "CUDA_ERROR_ILLEGAL_ADDRESS" : e ? "CUDA_ERROR_FAKE" : "CUDA_SUCCESS";
  OK;
}

// A fault or hang injected by $FAKE_CUDA_FAULT_BLOCK / $FAKE_CUDA_HANG_BLOCK (see the head).
static int g_sticky_error;  // 700 once a launch faulted: the context is dead
static int g_hang_pending;
static int env_has_block(const char* name, unsigned block) {  // $name: "256" or "64,256"
  for (const char* v = getenv(name); v && *v;) {
    if ((unsigned)atoi(v) == block) return 1;
    v = strchr(v, ',');
    if (v) ++v;
  }
  return 0;
}
static CUresult synchronized(void) {
  if (g_hang_pending)
    for (;;) sleep(1000);
  return g_sticky_error;
}
CUresult cuGetErrorString(CUresult e, const char** s) { *s = e ? "fake error" : "no error"; OK; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) { *d = ordinal; OK; }
CUresult cuDeviceGetCount(int* n) { *n = n_devices(); OK; }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  (void)d;
  snprintf(name, (size_t)len, "FAKE sm_90");
  OK;
}
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  (void)d;
  switch (attr) {
    case 1: *v = 1024; break;        // max threads per block
    case 8: *v = 49152; break;       // shared per block
    case 10: *v = 32; break;         // warp size
    case 12: *v = 65536; break;      // registers per block
    case 13: *v = 1980000; break;    // clock rate (kHz)
    case 16: *v = 132; break;        // SMs
    case 36: *v = 2619000; break;    // memory clock (kHz)
    case 37: *v = 5120; break;       // bus width
    case 38: *v = 50 << 20; break;   // L2 bytes
    case 75: *v = getenv("FAKE_CUDA_CC") ? atoi(getenv("FAKE_CUDA_CC")) / 10 : 9; break;  // compute capability
    case 76: *v = getenv("FAKE_CUDA_CC") ? atoi(getenv("FAKE_CUDA_CC")) % 10 : 0; break;
    case 81: *v = 233472; break;     // shared per SM
    case 82: *v = 65536; break;      // registers per SM
    case 97: *v = 232448; break;     // shared per block, opt-in
    default: *v = 1; break;
  }
  OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (d < 0 || d >= n_devices()) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *c = &g_ctx_tokens[d];
  OK;
}
// As the driver: a thread has no current context until one is set on it.
CUresult cuCtxGetCurrent(CUcontext* c) { *c = g_current; OK; }
CUresult cuCtxSetCurrent(CUcontext c) { g_current = c; OK; }
CUresult cuCtxGetDevice(CUdevice* d) { *d = current_device(); OK; }
CUresult cuCtxSynchronize(void) { return synchronized(); }
CUresult cuCtxGetLimit(size_t* v, int limit) { (void)limit; *v = 0; OK; }
CUresult cuCtxSetLimit(int limit, size_t v) { (void)limit; (void)v; OK; }
// An ELF64 image's size: its section header table ends it (cubins put it last).
static size_t elf_size(const unsigned char* e) {
  if (memcmp(e, "\177ELF", 4) != 0 || e[4] != 2) return 0;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, e + 0x28, 8);
  memcpy(&shentsize, e + 0x3A, 2);
  memcpy(&shnum, e + 0x3C, 2);
  return (size_t)(shoff + (uint64_t)shentsize * shnum);
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  FakeModule* mod = (FakeModule*)calloc(1, sizeof(FakeModule));  // kept: handles outlive modules here
  mod->size = elf_size((const unsigned char*)image);
  if (mod->size) {
    unsigned char* copy = (unsigned char*)malloc(mod->size);
    memcpy(copy, image, mod->size);
    mod->image = copy;
  }
  mod->hash = 1469598103934665603ull;
  for (size_t i = 0; i < mod->size; ++i) mod->hash = (mod->hash ^ mod->image[i]) * 1099511628211ull;
  *m = mod;
  OK;
}
CUresult cuModuleUnload(CUmodule m) { (void)m; OK; }

// The parameter sizes of kernel `name` from the cubin's .nv.info.<name> section:
// EIATTR_KPARAM_INFO (0x17) records, 12-byte payload: index u32, ordinal u16,
// offset u16, then a word whose bits 18.. hold the size in bytes. -1 if absent.
static int cubin_param_sizes(const FakeModule* mod, const char* name, int* sizes) {
  const unsigned char* e = mod->image;
  if (!e) return -1;
  uint64_t shoff;
  uint16_t shentsize, shnum, shstrndx;
  memcpy(&shoff, e + 0x28, 8);
  memcpy(&shentsize, e + 0x3A, 2);
  memcpy(&shnum, e + 0x3C, 2);
  memcpy(&shstrndx, e + 0x3E, 2);
  uint64_t stroff;
  memcpy(&stroff, e + shoff + (uint64_t)shentsize * shstrndx + 0x18, 8);
  char want[300];
  snprintf(want, sizeof(want), ".nv.info.%s", name);
  for (uint16_t i = 0; i < shnum; ++i) {
    const unsigned char* sh = e + shoff + (uint64_t)shentsize * i;
    uint32_t name_off;
    uint64_t off, size;
    memcpy(&name_off, sh, 4);
    memcpy(&off, sh + 0x18, 8);
    memcpy(&size, sh + 0x20, 8);
    if (strcmp((const char*)e + stroff + name_off, want) != 0) continue;
    int n = 0;
    for (uint64_t p = off; p + 4 <= off + size;) {
      unsigned fmt = e[p], attr = e[p + 1];
      uint16_t len = 0;
      if (fmt == 0x04) memcpy(&len, e + p + 2, 2);  // EIFMT_SVAL: a payload of len bytes follows
      if (fmt == 0x04 && attr == 0x17 && len >= 12) {
        uint16_t ordinal;
        uint32_t word;
        memcpy(&ordinal, e + p + 8, 2);
        memcpy(&word, e + p + 12, 4);
        if (ordinal < MAX_PARAMS) {
          sizes[ordinal] = (int)(word >> 18);
          if (ordinal + 1 > n) n = ordinal + 1;
        }
      }
      p += 4 + (fmt == 0x04 ? len : 0);
    }
    return n;
  }
  return -1;
}

CUresult cuModuleGetFunction(void** f, CUmodule m, const char* name) {
  FakeFunction* fn = (FakeFunction*)calloc(1, sizeof(FakeFunction));  // kept: handles outlive modules here
  snprintf(fn->name, sizeof(fn->name), "%s", name);
  const FakeModule* mod = (const FakeModule*)m;
  fn->image_hash = mod ? mod->hash : 0;
  fn->n_params = mod ? cubin_param_sizes(mod, name, fn->param_sizes) : -1;
  *f = fn;
  OK;
}
CUresult cuFuncGetAttribute(int* v, int attr, void* f) {
  (void)f;
  *v = attr == 0 ? 1024 : attr == 4 ? 32 : 0;  // max threads per block, registers; sizes 0
  OK;
}
CUresult cuFuncSetAttribute(void* f, int attr, int v) { (void)f, (void)attr, (void)v; OK; }
CUresult cuFuncSetCacheConfig(void* f, int c) { (void)f, (void)c; OK; }
CUresult cuOccupancyMaxActiveClusters(int* n, void* f, const void* config) { (void)f, (void)config; *n = 1; OK; }
static int exportable(CUdeviceptr base) {
  const char* ipc = getenv("FAKE_CUDA_IPC");
  return !(ipc && *ipc == '0') && (base >> 40) != 0x7c;
}
CUresult cuPointerGetAttribute(void* data, int attr, CUdeviceptr p) {
  if (attr == 9) {  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    *(int*)data = device_of_address(p);
    OK;
  }
  if (attr == 10) {  // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
    *(int*)data = exportable(p);
    OK;
  }
  const char* peer = getenv("FAKE_CUDA_PEER_ACCESS");
  if (attr == 3 && device_of_address(p) != current_device() && !(peer && *peer == '1'))
    return 1;  // CUDA_ERROR_INVALID_VALUE: another device's memory, no peer access
  *(CUdeviceptr*)data = p;  // CU_POINTER_ATTRIBUTE_DEVICE_POINTER: itself
  OK;
}
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
  // $FAKE_CUDA_MAX_ALLOC: a device with little memory left (larger allocations: CUDA_ERROR_OUT_OF_MEMORY).
  const char* max = getenv("FAKE_CUDA_MAX_ALLOC");
  if (max && n > (size_t)strtoull(max, 0, 10)) return 2;
  *p = g_next_alloc;
  g_next_alloc += (n + 4095) & ~(size_t)4095;
  OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return cuMemAlloc(p, n); }
CUresult cuMemFree(CUdeviceptr p) { (void)p; OK; }
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; OK; }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) { (void)s; return cuMemAlloc(p, n); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)p, (void)s; OK; }
CUresult cuMemAllocHost(void** p, size_t n) { *p = malloc(n ? n : 1); OK; }
CUresult cuMemFreeHost(void* p) { free(p); OK; }
CUresult cuMemGetInfo(size_t* free_b, size_t* total_b) {
  // $FAKE_CUDA_FREE_BYTES: a device with that little memory free (default 64 GiB of 80).
  const char* f = getenv("FAKE_CUDA_FREE_BYTES");
  *free_b = f ? (size_t)strtoull(f, 0, 10) : (size_t)64 << 30;
  *total_b = (size_t)80 << 30;
  OK;
}
CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  if (p == 0) return 500;  // CUDA_ERROR_NOT_FOUND: no allocation holds it (XLA's zero-size buffers)
  *base = p;
  *size = 1 << 20;
  OK;
}
CUresult cuIpcGetMemHandle(void* handle, CUdeviceptr base) {
  if (!exportable(base)) return 1;  // CUDA_ERROR_INVALID_VALUE
  memset(handle, 0, 64);
  memcpy(handle, "FAKEIPC", 7);
  memcpy((char*)handle + 8, &base, 8);
  OK;
}
typedef struct {
  char reserved[64];
} FakeIpcHandle;
CUresult cuIpcOpenMemHandle(CUdeviceptr* p, FakeIpcHandle handle, unsigned flags) {
  (void)flags;
  if (memcmp(handle.reserved, "FAKEIPC", 7) != 0) return 1;
  memcpy(p, handle.reserved + 8, 8);
  OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { (void)p; OK; }
CUresult cuMemcpyDtoDAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { (void)a, (void)b, (void)n, (void)s; OK; }
CUresult cuMemcpyDtoHAsync(void* a, CUdeviceptr b, size_t n, CUstream s) { (void)b, (void)s; memset(a, 0, n); OK; }
CUresult cuMemcpyHtoDAsync(CUdeviceptr a, const void* b, size_t n, CUstream s) { (void)a, (void)b, (void)n, (void)s; OK; }
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) { (void)p, (void)v, (void)n, (void)s; OK; }
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, CUstream s) { (void)p, (void)v, (void)n, (void)s; OK; }
// Events: every elapsed time is 1 ms, unless $FAKE_CUDA_LAUNCH_MS gives launches a duration by
// their block size ("32:3,64:1": 3 ms for 32 threads a block, 1 ms for 64, others 0): a fake GPU
// clock then advances by each launch's duration, an event records the clock, and an elapsed time
// is the difference. $FAKE_CUDA_EVENT_LAG=k: an event is passed only k launches after it was
// recorded (cuEventQuery and cuEventElapsedTime answer CUDA_ERROR_NOT_READY before), as a GPU
// running behind.
typedef struct {
  double at_ms;
  long launches;  // launches made when it was recorded
  int recorded;
} FakeEvent;
static double g_gpu_ms;
static long g_launches;
static double launch_ms(unsigned block) {
  const char* spec = getenv("FAKE_CUDA_LAUNCH_MS");
  while (spec && *spec) {
    char* end;
    unsigned long b = strtoul(spec, &end, 10);
    if (*end != ':') break;
    double ms = strtod(end + 1, &end);
    if (b == block) return ms;
    spec = *end == ',' ? end + 1 : NULL;
  }
  return 0;
}
CUresult cuEventCreate(CUevent* e, unsigned f) {
  (void)f;
  *e = calloc(1, sizeof(FakeEvent));
  OK;
}
CUresult cuEventDestroy(CUevent e) {
  free(e);
  OK;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
  (void)s;
  FakeEvent* ev = (FakeEvent*)e;
  ev->at_ms = g_gpu_ms, ev->launches = g_launches, ev->recorded = 1;
  OK;
}
CUresult cuEventSynchronize(CUevent e) { (void)e; return synchronized(); }
static int event_passed(const FakeEvent* e) {
  const char* lag = getenv("FAKE_CUDA_EVENT_LAG");
  return !lag || g_launches >= e->launches + atol(lag);
}
CUresult cuEventQuery(CUevent e) { return event_passed((const FakeEvent*)e) ? 0 : 600; }  // CUDA_ERROR_NOT_READY
CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  const FakeEvent *x = (const FakeEvent*)a, *y = (const FakeEvent*)b;
  if (!x->recorded || !y->recorded) return 400;  // CUDA_ERROR_INVALID_HANDLE
  if (!event_passed(y)) return 600;              // CUDA_ERROR_NOT_READY
  *ms = getenv("FAKE_CUDA_LAUNCH_MS") ? (float)(y->at_ms - x->at_ms) : 1.0f;
  OK;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; return synchronized(); }
CUresult cuStreamIsCapturing(CUstream s, int* status) { (void)s; *status = 0; OK; }
CUresult cuStreamGetCtx(CUstream s, CUcontext* c) { (void)s; *c = current_ctx(); OK; }
CUresult cuThreadExchangeStreamCaptureMode(int* mode) { (void)mode; OK; }

CUresult cuTensorMapEncodeTiled(void* map, int type, uint32_t rank, void* addr, const uint64_t* dims,
                                const uint64_t* strides, const uint32_t* box, const uint32_t* estrides,
                                int interleave, int swizzle, int l2, int oob) {
  unsigned char* m = (unsigned char*)map;
  memset(m, 0, 128);
  if (!g_current) return 201;  // CUDA_ERROR_INVALID_CONTEXT, as the driver answers a thread without one
  if (rank < 1 || rank > 5) return 1;  // CUDA_ERROR_INVALID_VALUE
  m[0] = (unsigned char)type, m[1] = (unsigned char)rank, m[2] = (unsigned char)interleave;
  m[3] = (unsigned char)swizzle, m[4] = (unsigned char)l2, m[5] = (unsigned char)oob;
  uint64_t a = (uint64_t)(uintptr_t)addr;
  memcpy(m + 8, &a, 8);
  memcpy(m + 16, dims, 8 * rank);                    // 16..56
  if (rank > 1) memcpy(m + 56, strides, 8 * (rank - 1));  // 56..88: the driver reads rank - 1
  memcpy(m + 88, box, 4 * rank);                     // 88..108
  memcpy(m + 108, estrides, 4 * rank);               // 108..128
  OK;
}

// $FAKE_CUDA_PARAM_SIZES entry of `name`: its parameter sizes, or -1.
static int param_sizes(const char* name, int* sizes, int max) {
  const char* spec = getenv("FAKE_CUDA_PARAM_SIZES");
  size_t len = strlen(name);
  while (spec && *spec) {
    const char* end = strchr(spec, ';');
    if (!end) end = spec + strlen(spec);
    if ((size_t)(end - spec) > len && strncmp(spec, name, len) == 0 && spec[len] == ':') {
      int n = 0;
      const char* p = spec + len + 1;
      while (p < end && n < max) {
        sizes[n++] = atoi(p);
        while (p < end && *p != ',') ++p;
        if (p < end) ++p;
      }
      return n;
    }
    spec = *end ? end + 1 : end;
  }
  return -1;
}

static CUresult record(const char* how, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned shared,
                       unsigned nattrs, CUstream stream, void* f, void** params) {
  if (g_sticky_error) return g_sticky_error;
  if (env_has_block("FAKE_CUDA_FAULT_BLOCK", bx)) g_sticky_error = 700;
  if (env_has_block("FAKE_CUDA_HANG_BLOCK", bx)) g_hang_pending = 1;
  if (is_isolation_helper() && !(getenv("FAKE_CUDA_LOG_HELPER") && *getenv("FAKE_CUDA_LOG_HELPER") == '1')) OK;
  static int discard = -1;  // read once: getenv per launch would dominate a timed loop
  if (discard < 0) discard = getenv("FAKE_CUDA_LOG") && strcmp(getenv("FAKE_CUDA_LOG"), "discard") == 0;
  if (discard) OK;
  const char* path = getenv("FAKE_CUDA_LOG");
  const FakeFunction* fn = (const FakeFunction*)f;
  const char* name = fn->name;
  int env_sizes[MAX_PARAMS];
  const int* sizes = fn->param_sizes;
  int n = fn->n_params;
  if (n < 0) n = param_sizes(name, env_sizes, MAX_PARAMS), sizes = env_sizes;
  if (!path || n < 0) return 1;
  FILE* out = fopen(path, "a");
  if (!out) return 1;
  fprintf(out, "{\"via\": \"%s\", \"kernel\": \"%s\", \"image\": \"%016llx\", \"grid\": [%u, %u, %u], "
               "\"block\": %u, \"shared\": %u, \"attrs\": %u, \"device\": %d, \"stream\": %llu, \"params\": [",
          how, name, (unsigned long long)fn->image_hash, gx, gy, gz, bx, shared, nattrs, current_device(),
          (unsigned long long)(uintptr_t)stream);
  for (int i = 0; i < n; ++i) {
    fprintf(out, "%s\"", i ? ", " : "");
    const unsigned char* b = (const unsigned char*)params[i];
    for (int j = 0; j < sizes[i]; ++j) fprintf(out, "%02x", b[j]);
    fprintf(out, "\"");
  }
  fprintf(out, "]}\n");
  fclose(out);
  OK;
}

// $FAKE_CUDA_FAIL_BLOCK=64: a launch of 64 threads a block fails (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
CUresult cuLaunchKernelEx(const FakeLaunchConfig* c, void* f, void** params, void** extra) {
  (void)extra;
  const char* fail = getenv("FAKE_CUDA_FAIL_BLOCK");
  if (fail && (unsigned)atoi(fail) == c->blockDimX) return 701;
  g_gpu_ms += launch_ms(c->blockDimX);
  g_launches++;
  return record("ex", c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->sharedMemBytes, c->numAttrs, c->hStream,
                f, params);
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void** params, void** extra) {
  (void)by, (void)bz, (void)extra;
  return record("plain", gx, gy, gz, bx, shared, 0, s, f, params);
}

// cuGetProcAddress: lazytriton resolves every entry point through it.
typedef struct {
  const char* name;
  void* fn;
} Entry;
#define E(n) {#n, (void*)n}
static const Entry kEntries[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuGetErrorName), E(cuGetErrorString), E(cuDeviceGet),
    E(cuDeviceGetCount), E(cuDeviceGetName), E(cuDeviceGetAttribute), E(cuDevicePrimaryCtxRetain),
    E(cuCtxGetCurrent), E(cuCtxSetCurrent), E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuModuleLoadData),
    E(cuModuleUnload), E(cuModuleGetFunction), E(cuFuncGetAttribute), E(cuFuncSetAttribute),
    E(cuFuncSetCacheConfig), E(cuLaunchKernelEx), E(cuLaunchKernel), E(cuMemAlloc), E(cuMemFree),
    E(cuMemAllocAsync), E(cuMemFreeAsync), E(cuMemAllocHost), E(cuMemFreeHost), E(cuMemGetInfo),
    E(cuMemGetAddressRange), E(cuMemcpyDtoDAsync), E(cuMemcpyDtoHAsync), E(cuMemcpyHtoDAsync),
    E(cuMemsetD8Async), E(cuMemsetD32Async), E(cuEventCreate), E(cuEventDestroy), E(cuEventRecord),
    E(cuEventSynchronize), E(cuEventQuery), E(cuEventElapsedTime), E(cuStreamSynchronize), E(cuStreamIsCapturing),
    E(cuStreamGetCtx), E(cuThreadExchangeStreamCaptureMode), E(cuTensorMapEncodeTiled),
    E(cuPointerGetAttribute), E(cuOccupancyMaxActiveClusters), E(cuCtxGetLimit), E(cuCtxSetLimit),
    E(cuIpcGetMemHandle), E(cuIpcOpenMemHandle), E(cuIpcCloseMemHandle),
};

CUresult cuGetProcAddress_v2(const char* name, void** fn, int version, unsigned long long flags, int* status) {
  (void)version, (void)flags;
  if (status) *status = 0;
  for (size_t i = 0; i < sizeof(kEntries) / sizeof(kEntries[0]); ++i)
    if (strcmp(kEntries[i].name, name) == 0) {
      *fn = kEntries[i].fn;
      OK;
    }
  *fn = NULL;
  return 500;  // CUDA_ERROR_NOT_FOUND
}
CUresult cuGetProcAddress(const char* name, void** fn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(name, fn, version, flags, NULL);
}
