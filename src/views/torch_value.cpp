#include "views/torch_value.hpp"

#include <fmt/format.h>

#include <unordered_map>

#include "ckptfs/error.hpp"
#include "pickle/pickle_writer.hpp"
#include "views/zip_writer.hpp"

namespace ckptfs::views {

namespace {

// Latin-1 bytes as the UTF-8 text of the str Python decodes them to.
std::string latin1_to_utf8(std::string_view bytes) {
  std::string out;
  for (unsigned char ch : bytes) {
    if (ch < 0x80) {
      out.push_back(static_cast<char>(ch));
    } else {
      out.push_back(static_cast<char>(0xC0 | (ch >> 6)));
      out.push_back(static_cast<char>(0x80 | (ch & 0x3F)));
    }
  }
  return out;
}

class ValuePickler {
 public:
  TorchPickle finish(const pickle::Value& root) && {
    save(root);
    return {std::move(w_).finish(), std::move(storages_)};
  }

 private:
  using Kind = pickle::Kind;

  void save(const pickle::Value& v) {
    if (auto it = memo_.find(&v); it != memo_.end()) return w_.get(it->second);
    switch (v.kind) {
      case Kind::None:
        return w_.none();
      case Kind::Bool:
        return w_.boolean(v.boolean);
      case Kind::Int:
        return w_.integer(v.integer);
      case Kind::BigInt:
        return w_.big_integer(v.text);
      case Kind::Float:
        return w_.real(v.real);
      case Kind::String:
        w_.string(v.text);
        return remember(v);
      case Kind::Bytes:
        return save_bytes(v);
      case Kind::Tuple:
        return save_tuple(v);
      case Kind::List:
        w_.empty_list();
        remember(v);
        return appends(v.items);
      case Kind::Dict:
        return save_dict(v);
      case Kind::Set:
      case Kind::FrozenSet:
        return save_set(v);
      case Kind::Global:
        return w_.global(v.module, v.name);
      case Kind::Object:
        return save_object(v);
      case Kind::Native:
        return save_native(v);
    }
  }

  void remember(const pickle::Value& v) { memo_.emplace(&v, w_.memo_index()); }

  void appends(const std::vector<pickle::ValuePtr>& items) {
    if (!items.empty()) w_.append_items(items.size(), [&](size_t i) { save(*items[i]); });
  }

  void set_items(const pickle::Value& v) {
    if (v.entries.empty()) return;
    w_.set_items(v.entries.size(), [&](size_t i) {
      save(*v.entries[i].first);
      save(*v.entries[i].second);
    });
  }

  void save_tuple(const pickle::Value& v) {
    if (v.module == "torch" && v.name == "Size") {  // torch.Size(tuple): REDUCE of the class
      w_.global("torch", "Size");
      w_.begin_tuple(1);
      w_.begin_tuple(v.items.size());
      for (const auto& item : v.items) save(*item);
      w_.end_tuple(v.items.size());
      w_.end_tuple(1);
      w_.reduce();
      return remember(v);
    }
    w_.begin_tuple(v.items.size());
    for (const auto& item : v.items) save(*item);
    w_.end_tuple(v.items.size());
    if (!v.items.empty()) remember(v);
  }

  // Protocol 2 has no bytes opcode: CPython writes _codecs.encode(latin-1 text, 'latin1').
  void save_bytes(const pickle::Value& v) {
    if (v.text.empty()) {
      w_.global("__builtin__", "bytes");
      w_.begin_tuple(0);
      w_.end_tuple(0);
    } else {
      w_.global("_codecs", "encode");
      w_.begin_tuple(2);
      w_.string(latin1_to_utf8(v.text));
      w_.shared_string("latin1");
      w_.end_tuple(2);
    }
    w_.reduce();
    remember(v);
  }

  void save_dict(const pickle::Value& v) {
    if (v.module.empty()) {
      w_.empty_dict();
      remember(v);
    } else {  // OrderedDict: reduced to its class called without arguments, then items and state
      w_.global(v.module, v.name);
      w_.begin_tuple(0);
      w_.end_tuple(0);
      w_.reduce();
      remember(v);
    }
    set_items(v);
    if (v.state) {
      save(*v.state);
      w_.build();
    }
  }

  void save_set(const pickle::Value& v) {
    w_.global("__builtin__", v.kind == Kind::Set ? "set" : "frozenset");
    w_.begin_tuple(1);
    w_.empty_list();
    appends(v.items);
    w_.end_tuple(1);
    w_.reduce();
    remember(v);
  }

  void save_object(const pickle::Value& v) {
    if (!v.member.empty()) {  // getattr(cls, member), as enum members are pickled by name
      w_.global("__builtin__", "getattr");
      w_.begin_tuple(2);
      w_.global(v.module, v.name);
      w_.string(v.member);
      w_.end_tuple(2);
      w_.reduce();
      if (v.args) {
        save(*v.args);
        w_.reduce();
      }
    } else {
      w_.global(v.module, v.name);
      if (v.args) {
        save(*v.args);
      } else {
        w_.begin_tuple(0);
        w_.end_tuple(0);
      }
      if (v.made_by_new) {
        w_.new_object();
      } else {
        w_.reduce();
      }
    }
    remember(v);
    appends(v.items);
    set_items(v);
    if (v.state) {
      save(*v.state);
      w_.build();
    }
  }

  void save_native(const pickle::Value& v) {
    const auto* ref = catalog::as_tensor_value(v);
    if (ref == nullptr) throw FormatError(fmt::format("torch.save view: cannot write a {}", v.describe()));
    auto [it, inserted] =
        storage_keys_.try_emplace(&*ref->tensor, storages_.size());  // one storage per tensor
    if (inserted) storages_.push_back(ref->tensor);
    write_tensor(*ref, it->second);
    remember(v);
  }

  // What torch.save's pickler writes for each tensor: _rebuild_tensor_v2(storage, 0, size, stride, False,
  // OrderedDict()), with storage the persistent id ('storage', <X>Storage, key, 'cpu', numel). Dtypes
  // without a legacy storage class are written as torch >= 2.1 does: _rebuild_tensor_v3 on an
  // UntypedStorage whose numel counts bytes, with the dtype after the hooks.
  void write_tensor(const catalog::TensorValue& value, size_t key) {
    const catalog::LogicalTensor& t = *value.tensor;
    const std::string_view storage_class = dtype_storage_class(t.dtype);
    const bool v3 = storage_class.empty();
    w_.global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    const size_t n_args = v3 ? 7 : 6;
    w_.begin_tuple(n_args);
    w_.begin_tuple(5);
    w_.shared_string("storage");
    // torch.save pickles the class by its module: torch.storage.UntypedStorage (weights_only allows that).
    w_.global(v3 ? "torch.storage" : "torch", v3 ? "UntypedStorage" : storage_class);
    w_.string(std::to_string(key));
    w_.shared_string("cpu");
    w_.integer(static_cast<int64_t>(v3 ? t.nbytes() : t.numel()));
    w_.end_tuple(5);
    w_.persistent_id();
    w_.integer(0);
    // Contiguous strides as torch computes them: a zero-size dimension counts as 1.
    const std::vector<int64_t>& shape = value.shape;
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= std::max<int64_t>(shape[i], 1);
    }
    const auto int_tuple = [&](std::span<const int64_t> items) {
      w_.begin_tuple(items.size());
      for (int64_t d : items) w_.integer(d);
      w_.end_tuple(items.size());
    };
    int_tuple(shape);
    int_tuple(strides);
    w_.boolean(value.requires_grad);
    w_.global("collections", "OrderedDict");
    w_.begin_tuple(0);
    w_.end_tuple(0);
    w_.reduce();
    if (v3) w_.global("torch", dtype_torch_name(t.dtype));
    w_.end_tuple(n_args);
    w_.reduce();
  }

  pickle::PickleWriter w_;
  std::unordered_map<const pickle::Value*, uint32_t> memo_;
  std::unordered_map<const catalog::LogicalTensor*, size_t> storage_keys_;
  std::vector<catalog::TensorRef> storages_;
};

}  // namespace

TorchPickle pickle_for_torch_save(const pickle::Value& root) {
  return ValuePickler().finish(root);
}

VirtualFilePtr make_torch_save_value(const pickle::Value& root, const std::string& archive_name,
                                     ZipRecords layout) {
  TorchPickle pickled = pickle_for_torch_save(root);
  std::vector<ZipRecord> records;
  records.push_back({"data.pkl", std::move(pickled.data_pkl)});
  if (layout == ZipRecords::torch_2_1) {
    records.push_back({".format_version", "1"});
    records.push_back({".storage_alignment", std::to_string(kZipAlignment)});
    records.push_back({"byteorder", "little"});
  }
  for (size_t i = 0; i < pickled.storages.size(); ++i)
    records.push_back({fmt::format("data/{}", i), pickled.storages[i]});
  records.push_back({"version", "3\n"});
  ExtentBuilder out;
  append_zip(out, archive_name, records);
  return std::make_shared<ExtentFile>(std::move(out).finish());
}

}  // namespace ckptfs::views
