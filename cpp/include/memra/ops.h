// The CPU reference backend: every op the families need, in f32 arithmetic (weights are read in
// their file dtype and converted per row). These functions are the numeric oracle for the CUDA
// backend; transformers 5.17 (models/glm5_next/modeling_glm5_next.py and the other families'
// modeling files) is the oracle for them.
//
// Conventions: all activation pointers are f32, C-contiguous, row-major, with the shape written
// beside each argument. T is the number of tokens in the call. Ops never throw and never
// allocate on behalf of the caller except scratch; those that can refuse a scalar argument
// return a Status, the rest are void (the binding layer checks shapes before calling).
//
// This header is the umbrella: an area's declarations live in memra/cpu/<area>.h beside its
// cpu/<area>.cpp, and ops.h includes them so that it stays the one header for every reference op.
#pragma once

#include <cstdint>

#include "memra/cpu/attention.h"
#include "memra/cpu/basic.h"
#include "memra/cpu/dsa.h"
#include "memra/cpu/gdn.h"
#include "memra/cpu/kda.h"
#include "memra/cpu/linear.h"
#include "memra/cpu/mhc.h"
#include "memra/cpu/mla.h"
#include "memra/cpu/mlp.h"
#include "memra/cpu/moe.h"
#include "memra/cpu/sample.h"
#include "memra/status.h"
#include "memra/tensor.h"
