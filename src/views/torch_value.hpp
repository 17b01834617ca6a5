// torch.save of a general value tree (what DeepSpeed's universal files and optimizer states hold): the
// pickle::Value model the unpickler produces, with tensors as references to logical tensors. Pickled as
// CPython's protocol-2 pickler and torch.save's persistent ids write it, so torch.load reads it back as
// the same Python objects.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/pickle.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs::views {

struct TorchPickle {
  std::string data_pkl;
  std::vector<catalog::TensorRef> storages;  // storage key i holds storages[i]'s bytes
};

// Pickles `root`. Every kind the unpickler produces is written back: None, bool, int (any size),
// float, str, bytes, tuple, list, dict and OrderedDict (with BUILD state), set, frozenset, globals and
// opaque objects (REDUCE or NEWOBJ with their args, items and state). A subtree reached twice through
// the same ValuePtr is written once and fetched from the memo after, as Python does for one object.
// Throws FormatError for a native value that is not a catalog::TensorValue.
TorchPickle pickle_for_torch_save(const pickle::Value& root);

// The records of the zip: torch >= 2.1 adds .format_version, .storage_alignment and byteorder to the
// data.pkl, data/<key>..., version that torch 1.13 writes (and DeepSpeed's universal files hold).
enum class ZipRecords { torch_2_1, torch_1_13 };

// A torch.save zip of `root` (its tensors' handles own them).
VirtualFilePtr make_torch_save_value(const pickle::Value& root, const std::string& archive_name,
                                     ZipRecords records = ZipRecords::torch_2_1);

}  // namespace ckptfs::views
