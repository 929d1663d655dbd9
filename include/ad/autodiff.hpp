#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ad/graph.hpp"
#include "ad/schedule.hpp"

namespace ad {

// Appends to loss's graph the nodes computing d(loss)/d(w) for each w in
// `wrt`, and returns them (same shapes as wrt). Nothing is computed: eval()
// of a returned Var computes it plainly (every value it needs kept until its
// last use, no recomputation); for gradients computed under a policy, in the
// parameters' pass, use backward_wrt below.
// - loss must have one element, unless `seed` (the gradient of loss, same
//   shape and dtype) is given; otherwise ad::Error.
// - A w that loss does not depend on gets a zero gradient (a constant node).
// - Throws ad::Error if the gradient has to flow through an op that has no
//   backward rule (e.g. double backward through softmax_backward).
std::vector<Var> grad(const Var& loss, const std::vector<Var>& wrt, const Var& seed = {});

// Computes loss and the gradient of loss with respect to every Parameter it
// depends on, and adds them into Parameter::grad() (gradients accumulate
// until zero_grad()). A parameter read only through ad::detach, or only
// through the operands of comparisons (greater, ...) or where's cond, whose
// gradient is zero, is not one of them: it gets no gradient (an optimizer
// leaves it alone). The policy decides what is kept, freed and recomputed.
// - Throws ad::Error if loss is not a one-element tensor and no seed is given,
//   or if loss depends on no Parameter.
// - Calling backward again on the same graph reuses the gradient nodes built
//   the first time and accumulates the gradients once more (as PyTorch does
//   with retain_graph=true); values freed by the first call are recomputed.
//   Values computed from a parameter or input written since (an optimizer
//   step, fill, data<T>() on a non-const Tensor) are stale and recomputed
//   too, loss.value() included: the gradients and the loss are those of the
//   current values (Storage::version; Graph::input).
// After the call loss.value() is available; other values may have been freed
// and are recomputed on demand.
// Threads: graphs are one thread's each; backward calls on several threads
// may share Parameters (and a Policy): each holds its graph's parameters
// from planning to the end of its run, so calls that reach one Parameter take
// turns and every gradient is added. Stepping an optimizer while another
// thread's backward writes the same gradients is the caller's to order.
Report backward(const Var& loss, const Policy& policy = policy::keep_all(), const Var& seed = {});

// The plan backward() would run (gradient nodes are built, nothing is
// computed): inspect it with explain(), or its predicted peak
// (plan.schedule.predicted_peak_bytes).
Plan plan_backward(const Var& loss, const Policy& policy = policy::keep_all(), const Var& seed = {});

// backward() that also keeps the values of `keep` — forward values of loss's
// graph, made before this loss's first backward: a recurrent layer's final
// states to carry into the next chunk of truncated backpropagation, logits
// for a metric — computed in the same pass and held to the end (the
// predicted and measured peaks count them): Report::values[i] is keep[i]'s
// value as the forward pass computed it, with no second forward. (Reading
// keep[i].value() after backward() instead may recompute it, and after an
// optimizer step it would be recomputed from the new parameters.) Throws
// ad::Error for an empty keep, an undefined Var, one of another graph or one
// made after the loss's first backward, and as backward() does.
Report backward_keep(const Var& loss, const std::vector<Var>& keep, const Policy& policy = policy::keep_all(),
                     const Var& seed = {});

// backward() that also computes the gradient of loss with respect to each
// Var in `wrt` (graph inputs, typically, or any node of loss's graph) under
// the same policy, in the same pass: parameters' gradients accumulate as in
// backward(), and Report::grads[i] is d(loss)/d(wrt[i]) (wrt[i]'s shape and
// dtype; zeros where loss does not depend on it). The gradients are plan
// targets, so the predicted and measured peaks include them. Use it for the
// gradient a pipeline stage sends back (with `seed` the gradient it
// received), or input saliency. loss need not depend on any Parameter.
// Throws ad::Error for an empty wrt, an undefined Var or one of another graph.
Report backward_wrt(const Var& loss, const std::vector<Var>& wrt, const Policy& policy = policy::keep_all(),
                    const Var& seed = {});
Plan plan_backward_wrt(const Var& loss, const std::vector<Var>& wrt, const Policy& policy = policy::keep_all(),
                       const Var& seed = {});

}  // namespace ad
