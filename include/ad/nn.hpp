#pragma once
// The training toolkit: modules (layers, recurrent, transformer), optimizers, learning-rate schedules,
// safetensors files, a progress line.
#include "ad/nn/layers.hpp"
#include "ad/nn/module.hpp"
#include "ad/nn/optim.hpp"
#include "ad/nn/progress.hpp"
#include "ad/nn/recurrent.hpp"
#include "ad/nn/serialize.hpp"
#include "ad/nn/transformer.hpp"
#include "ad/safetensors.hpp"
