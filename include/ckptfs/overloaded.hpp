// The overload set that a std::visit of a closed sum type (catalog::TensorSource, io::File::Origin) takes:
// one lambda per alternative and no generic one, so an added alternative fails to compile at every visit.
#pragma once

namespace ckptfs {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace ckptfs
