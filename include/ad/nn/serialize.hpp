#pragma once
// Saving and loading modules and optimizers as safetensors files.
#include <string>

#include "ad/nn/module.hpp"
#include "ad/nn/optim.hpp"
#include "ad/safetensors.hpp"

namespace ad::nn {

// A module's parameters and buffers by name (handles sharing their storage);
// a parameter tied under several names appears under each.
NamedTensors module_state(const Module& m);
// Copies `state` into the module's parameters and buffers. Every name, shape
// and dtype is checked before anything is copied, so a failed load changes
// nothing. strict: every parameter and buffer must be present and every
// tensor must belong to the module; otherwise absent ones are left as they
// are and extra tensors ignored. A tied parameter needs one of its names
// (files written here hold it once); present under several, they must hold
// the same bits. Throws ad::Error naming the tensor.
void load_module_state(const Module& m, const NamedTensors& state, bool strict = true);

// Parameters and buffers of `m` (names from named_parameters()) to `path`,
// atomically (see save_safetensors); a tied parameter once, under its first
// name.
void save_module(const std::string& path, const Module& m, const Metadata& metadata = {});
// Loads a file written by save_module (or any safetensors file with these
// names, shapes and dtypes) into `m`; returns the file's metadata.
Metadata load_module(const std::string& path, const Module& m, bool strict = true);

// An optimizer's state (Optimizer::state()) to `path`, with `metadata` and
// two entries of its own: "ad.optimizer" (name(), e.g. "AdamW") and
// "ad.optimizer.hyperparameters" (hyperparameters()); `metadata` may not use
// these keys. load_optimizer restores the state and returns the metadata (those
// entries included); it throws ad::Error if the file's state is of another
// kind of optimizer (Adam's moments loaded into AdamW; a file without
// "ad.optimizer", as written before 2026-11-26, is checked by its slot names
// only, which Adam and AdamW share), and leaves comparing
// the hyperparameters, which a resumed run may change on purpose, to the caller.
void save_optimizer(const std::string& path, const Optimizer& opt, const Metadata& metadata = {});
Metadata load_optimizer(const std::string& path, Optimizer& opt);

// A training checkpoint in one file: the module's tensors named
// "model.<name>", the optimizer's "optim.<name>", and `metadata` (e.g. the
// data position or the step) with the optimizer's entries as save_optimizer
// writes them. load_checkpoint restores both (strictly; the optimizer's kind
// must match) and returns the metadata; nothing is changed if any check fails.
void save_checkpoint(const std::string& path, const Module& m, const Optimizer& opt, const Metadata& metadata = {});
Metadata load_checkpoint(const std::string& path, const Module& m, Optimizer& opt);

}  // namespace ad::nn
