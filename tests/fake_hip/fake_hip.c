// A stand-in libamdhip64.so for CPU-only tests (tests/test_launch_bytes_hip.py),
// as tests/fake_cuda/fake_cuda.c is for libcuda.so.1: every call succeeds on
// made-up handles, and the launches are recorded, so that the bytes a launch
// would hand an AMD GPU can be compared with what Triton's own HIP launcher
// (its driver.c, built against this library) hands it, on a machine with no GPU.
//   hipModuleLaunchKernel / hipModuleLaunchCooperativeKernel / hipDrvLaunchKernelEx:
//     one JSON line appended to $FAKE_HIP_LOG with the call, grid, block, shared
//     bytes, stream, the launch attributes and every parameter's bytes in hex;
//     parameter sizes come from $FAKE_HIP_PARAM_SIZES ("kernel:8,8,4;other:8"),
//     as the HIP runtime takes them from the code object's kernel arguments.
//   hipModuleLoadData(Ex): the image's first 4 bytes must be an ELF header (an HSACO).
// Device: one "FAKE MI300X" whose arch ($FAKE_HIP_ARCH, default
// "gfx942:sramecc+:xnack-") and wavefront size ($FAKE_HIP_WARP, default 64) are
// reported through hipGetDeviceProperties(R0600) and hipDeviceGetAttribute.
// Resolvable by dlsym (lazytriton) and hipGetProcAddress (Triton).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef void* hipStream_t;

typedef struct {
  char name[256];
} FakeFunction;

typedef struct {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int cooperative;
    int dims[3];
  } val;
} FakeLaunchAttribute;  // hipLaunchAttribute's layout

typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  hipStream_t hStream;
  FakeLaunchAttribute* attrs;
  unsigned numAttrs;
} FakeLaunchConfig;  // HIP_LAUNCH_CONFIG's layout

static int g_module_token, g_event_token;
static int g_current_device;
static uint64_t g_next_alloc = 0x7e0000000000ull;

#define OK return 0
#define ARCH_OFFSET 1160  // hipDeviceProp_tR0600.gcnArchName
#define WARP_OFFSET 308   // hipDeviceProp_tR0600.warpSize

static const char* arch(void) { return getenv("FAKE_HIP_ARCH") ? getenv("FAKE_HIP_ARCH") : "gfx942:sramecc+:xnack-"; }
static int warp(void) { return getenv("FAKE_HIP_WARP") ? atoi(getenv("FAKE_HIP_WARP")) : 64; }

hipError_t hipInit(unsigned flags) { (void)flags; OK; }
hipError_t hipDriverGetVersion(int* v) { *v = 70152802; OK; }  // 7.1.52802
hipError_t hipRuntimeGetVersion(int* v) { *v = 70152802; OK; }
const char* hipGetErrorName(hipError_t e) { return e ? "hipErrorFake" : "hipSuccess"; }
const char* hipGetErrorString(hipError_t e) { return e ? "fake error" : "no error"; }
hipError_t hipGetLastError(void) { OK; }
hipError_t hipDeviceGet(int* d, int ordinal) { *d = ordinal; OK; }
hipError_t hipGetDeviceCount(int* n) { *n = 1; OK; }
hipError_t hipDeviceGetName(char* name, int len, int d) {
  (void)d;
  snprintf(name, (size_t)len, "FAKE MI300X");
  OK;
}
hipError_t hipDeviceGetAttribute(int* v, int attr, int d) {
  (void)d;
  switch (attr) {
    case 5: *v = 2100000; break;     // clock rate (kHz)
    case 10: *v = 1; break;          // cooperative launch
    case 19: *v = 4 << 20; break;    // L2 bytes
    case 23: *v = 9; break;          // "compute capability" major (gfx942: 9.4)
    case 61: *v = 4; break;          // minor
    case 56: *v = 1024; break;       // max threads per block
    case 63: *v = 304; break;        // CUs
    case 74: *v = 65536; break;      // shared per block
    case 75: *v = 65536; break;      // shared per block, opt-in
    case 87: *v = warp(); break;     // warp size
    case 10002: *v = 65536; break;   // shared per CU
    default: *v = 0; break;
  }
  OK;
}
hipError_t hipGetDevicePropertiesR0600(void* props, int d) {
  (void)d;
  memset(props, 0, 1472);
  int w = warp();
  memcpy((char*)props + WARP_OFFSET, &w, sizeof(w));
  snprintf((char*)props + ARCH_OFFSET, 256, "%s", arch());
  snprintf((char*)props, 256, "FAKE MI300X");
  OK;
}
hipError_t hipGetDeviceProperties(void* props, int d) { return hipGetDevicePropertiesR0600(props, d); }
hipError_t hipGetDevice(int* d) { *d = g_current_device; OK; }
hipError_t hipSetDevice(int d) {
  if (d != 0) return 101;  // hipErrorInvalidDevice
  g_current_device = d;
  OK;
}
hipError_t hipDeviceSynchronize(void) { OK; }
hipError_t hipModuleLoadData(void** m, const void* image) {
  if (!image || memcmp(image, "\x7f" "ELF", 4) != 0) return 200;  // hipErrorInvalidImage
  *m = &g_module_token;
  OK;
}
hipError_t hipModuleLoadDataEx(void** m, const void* image, unsigned n, void* opts, void** vals) {
  (void)n, (void)opts, (void)vals;
  return hipModuleLoadData(m, image);
}
hipError_t hipModuleUnload(void* m) { (void)m; OK; }
hipError_t hipModuleGetFunction(void** f, void* m, const char* name) {
  (void)m;
  FakeFunction* fn = (FakeFunction*)calloc(1, sizeof(FakeFunction));  // kept: handles outlive modules here
  snprintf(fn->name, sizeof(fn->name), "%s", name);
  *f = fn;
  OK;
}
hipError_t hipFuncGetAttribute(int* v, int attr, void* f) {
  (void)f;
  *v = attr == 0 ? 1024 : attr == 4 ? 32 : 0;  // max threads per block, registers; sizes 0
  OK;
}
hipError_t hipPointerGetAttribute(void* data, int attr, void* p) {
  (void)attr;
  *(void**)data = p;  // HIP_POINTER_ATTRIBUTE_DEVICE_POINTER: itself
  OK;
}
hipError_t hipMalloc(void** p, size_t n) {
  *p = (void*)(uintptr_t)g_next_alloc;
  g_next_alloc += (n + 4095) & ~(size_t)4095;
  OK;
}
hipError_t hipFree(void* p) { (void)p; OK; }
hipError_t hipMallocAsync(void** p, size_t n, hipStream_t s) { (void)s; return hipMalloc(p, n); }
hipError_t hipFreeAsync(void* p, hipStream_t s) { (void)p, (void)s; OK; }
hipError_t hipHostMalloc(void** p, size_t n, unsigned flags) { (void)flags; *p = malloc(n ? n : 1); OK; }
hipError_t hipHostFree(void* p) { free(p); OK; }
hipError_t hipMemGetInfo(size_t* free_b, size_t* total_b) { *free_b = (size_t)160 << 30; *total_b = (size_t)192 << 30; OK; }
hipError_t hipMemGetAddressRange(void** base, size_t* size, void* p) { *base = p; *size = 1 << 20; OK; }
hipError_t hipMemcpyDtoDAsync(void* a, void* b, size_t n, hipStream_t s) { (void)a, (void)b, (void)n, (void)s; OK; }
hipError_t hipMemcpyDtoHAsync(void* a, void* b, size_t n, hipStream_t s) { (void)b, (void)s; memset(a, 0, n); OK; }
hipError_t hipMemcpyHtoDAsync(void* a, void* b, size_t n, hipStream_t s) { (void)a, (void)b, (void)n, (void)s; OK; }
hipError_t hipMemsetD8Async(void* p, unsigned char v, size_t n, hipStream_t s) { (void)p, (void)v, (void)n, (void)s; OK; }
hipError_t hipMemsetD32Async(void* p, int v, size_t n, hipStream_t s) { (void)p, (void)v, (void)n, (void)s; OK; }
hipError_t hipEventCreateWithFlags(void** e, unsigned f) { (void)f; *e = &g_event_token; OK; }
hipError_t hipEventDestroy(void* e) { (void)e; OK; }
hipError_t hipEventRecord(void* e, hipStream_t s) { (void)e, (void)s; OK; }
hipError_t hipEventSynchronize(void* e) { (void)e; OK; }
hipError_t hipEventQuery(void* e) { (void)e; OK; }
hipError_t hipEventElapsedTime(float* ms, void* a, void* b) { (void)a, (void)b; *ms = 1.0f; OK; }
hipError_t hipStreamSynchronize(hipStream_t s) { (void)s; OK; }
hipError_t hipStreamIsCapturing(hipStream_t s, int* status) { (void)s; *status = 0; OK; }
hipError_t hipStreamGetDevice(hipStream_t s, int* d) { (void)s; *d = 0; OK; }
hipError_t hipThreadExchangeStreamCaptureMode(int* mode) { (void)mode; OK; }

// $FAKE_HIP_PARAM_SIZES entry of `name`: its parameter sizes, or -1.
static int param_sizes(const char* name, int* sizes, int max) {
  const char* spec = getenv("FAKE_HIP_PARAM_SIZES");
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

static hipError_t record(const char* how, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned shared, hipStream_t stream, const FakeLaunchAttribute* attrs,
                         unsigned nattrs, void* f, void** params, void** extra) {
  const char* path = getenv("FAKE_HIP_LOG");
  const char* name = ((FakeFunction*)f)->name;
  int sizes[512];
  int n = param_sizes(name, sizes, 512);
  if (!path || n < 0 || extra != NULL) return 1;
  FILE* out = fopen(path, "a");
  if (!out) return 1;
  fprintf(out, "{\"via\": \"%s\", \"kernel\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], "
               "\"shared\": %u, \"stream\": %llu, \"attrs\": [", how, name, gx, gy, gz, bx, by, bz, shared,
          (unsigned long long)(uintptr_t)stream);
  for (unsigned i = 0; i < nattrs; ++i)
    fprintf(out, "%s[%d, %d, %d, %d]", i ? ", " : "", attrs[i].id, attrs[i].val.dims[0], attrs[i].val.dims[1],
            attrs[i].val.dims[2]);
  fprintf(out, "], \"params\": [");
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

hipError_t hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, hipStream_t s, void** params, void** extra) {
  return record("launch", gx, gy, gz, bx, by, bz, shared, s, NULL, 0, f, params, extra);
}
// hip_runtime_api.h's signature: no `extra` (Triton's driver.c declares one more and passes 0: ignored).
hipError_t hipModuleLaunchCooperativeKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, hipStream_t s,
                                            void** params) {
  return record("cooperative", gx, gy, gz, bx, by, bz, shared, s, NULL, 0, f, params, NULL);
}
hipError_t hipDrvLaunchKernelEx(const FakeLaunchConfig* c, void* f, void** params, void** extra) {
  return record("ex", c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                c->sharedMemBytes, c->hStream, c->attrs, c->numAttrs, f, params, extra);
}

// hipGetProcAddress: Triton's HIP launcher resolves its entry points through it.
typedef struct {
  const char* name;
  void* fn;
} Entry;
#define E(n) {#n, (void*)n}
static const Entry kEntries[] = {
    E(hipGetLastError), E(hipGetErrorString), E(hipGetErrorName), E(hipGetDeviceProperties),
    E(hipGetDevicePropertiesR0600), E(hipModuleLoadDataEx), E(hipModuleLoadData), E(hipModuleUnload),
    E(hipModuleGetFunction), E(hipFuncGetAttribute), E(hipDrvLaunchKernelEx), E(hipModuleLaunchKernel),
    E(hipModuleLaunchCooperativeKernel), E(hipPointerGetAttribute), E(hipDriverGetVersion), E(hipInit),
    E(hipGetDevice), E(hipSetDevice), E(hipGetDeviceCount), E(hipDeviceGetAttribute), E(hipMalloc), E(hipFree),
};

hipError_t hipGetProcAddress(const char* name, void** fn, int version, uint64_t flags, int* status) {
  (void)version, (void)flags;
  if (status) *status = 0;
  for (size_t i = 0; i < sizeof(kEntries) / sizeof(kEntries[0]); ++i)
    if (strcmp(kEntries[i].name, name) == 0) {
      *fn = kEntries[i].fn;
      OK;
    }
  *fn = NULL;
  if (status) *status = 1;  // HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return 500;  // hipErrorNotFound
}
