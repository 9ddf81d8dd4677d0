// lazytriton's C++ runtime: one core shared by the generated Python stubs, the
// XLA FFI handler and C++ programs that embed it.
#pragma once
#include "lazytriton/call_site.h"
#include "lazytriton/driver.h"
#include "lazytriton/kernel.h"
#include "lazytriton/resolve_table.h"
#include "lazytriton/tuning.h"
