// The HIP driver layer (hip_driver.cc), internal to liblazytriton: fills the
// one driver table (lazytriton/driver.h) with adapters over libamdhip64.so.
#pragma once
#include <string>

#include "lazytriton/driver.h"

namespace lt {

// Loads libamdhip64.so ($LAZYTRITON_LIBHIP, else the loader's search path) and
// fills `d`; "" on success, else why not. `*present`: whether the library
// loaded at all (so that a machine without ROCm keeps CUDA's message alone).
std::string load_hip(Driver& d, bool* present);

// hipDeviceProp's gcnArchName up to its feature suffix ("gfx942"), and the
// wavefront size (64 on CDNA, 32 on RDNA).
std::string hip_arch_name(int device);
int hip_warp_size(int device);

}  // namespace lt
