// Deprecated: the C++ API of attn_ops is csrc/attn_ops.h. This forwarding header stays for one release, so
// LibTorch programs that include "attention.h" keep building; include "attn_ops.h" instead.
#pragma once

#pragma message("attention.h is deprecated: include \"attn_ops.h\" (the C++ API of attn_ops)")
#include "attn_ops.h"
