// torch's unpickling hooks without torch: persistent ids become storage references, and the _rebuild_*
// functions become TensorObjects whose views are checked against their storage. Where each storage's
// bytes are is only known to the container (zip record or legacy walk), so spans are filled in by
// resolve() after unpickling.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/pickle.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::torch {

// A storage as the pickle names it (a pickle::Native): (part of) a root storage that the container stores
// under `key`.
struct StorageRef {
  std::string key;
  DType dtype = DType::U8;  // the storage class's element type; U8 for UntypedStorage
  uint64_t offset = 0;      // bytes into the root storage (legacy storage views)
  uint64_t nbytes = 0;
};

// A root storage: its element type and count, as the persistent ids give them.
struct RootStorage {
  DType dtype = DType::U8;
  uint64_t numel = 0;
  uint64_t nbytes = 0;
};

class TensorBuilder {
 public:
  // Options whose hooks call this builder (which must outlive the unpickling).
  pickle::UnpickleOptions options();

  // Root storages referenced so far, by key.
  const std::map<std::string, RootStorage>& storages() const { return storages_; }

  // Fills every tensor's storage span. `locate(key, root)` returns where root storage `key` lies and
  // checks that it holds root.nbytes bytes.
  void resolve(const std::function<StorageSpan(const std::string& key, const RootStorage& root)>& locate);

 private:
  pickle::ValuePtr persistent_load(const pickle::ValuePtr& pid);
  pickle::ValuePtr reduce(const pickle::Value& callable, const pickle::ValuePtr& args);
  pickle::ValuePtr rebuild_tensor(std::string_view fn, const std::vector<pickle::ValuePtr>& a);
  pickle::ValuePtr rebuild_parameter(const std::vector<pickle::ValuePtr>& a);
  pickle::ValuePtr add_tensor(SourceTensor tensor, std::shared_ptr<const StorageRef> storage);

  struct Pending {
    std::shared_ptr<TensorObject> tensor;
    std::shared_ptr<const StorageRef> storage;
  };
  std::map<std::string, RootStorage> storages_;
  std::map<std::string, pickle::ValuePtr> refs_;  // one StorageRef value per key (and view)
  std::vector<Pending> tensors_;
  std::map<const SourceTensor*, std::shared_ptr<const StorageRef>> storage_of_;  // by TensorObject::tensor
};

}  // namespace ckptfs::torch
