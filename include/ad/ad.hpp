#pragma once
// ad — a C++ autodiff engine with built-in rematerialisation. One include.
#include "ad/autodiff.hpp"
#include "ad/error.hpp"
#include "ad/format.hpp"
#include "ad/graph.hpp"
#include "ad/ops.hpp"
#include "ad/schedule.hpp"
#include "ad/semiseparable.hpp"
#include "ad/tensor.hpp"
#include "ad/version.hpp"
