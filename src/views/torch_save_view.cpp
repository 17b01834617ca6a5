// A torch.save zip of {name: tensor} built from the catalog, laid out as torch writes it (format spec §A.8).
#include <fmt/format.h>

#include <unordered_set>

#include "ckptfs/error.hpp"
#include "pickle/pickle_writer.hpp"
#include "views/zip_writer.hpp"

namespace ckptfs::views {

namespace {

// What torch.save's pickler writes for each tensor: _rebuild_tensor_v2(storage, 0, size, stride, False,
// OrderedDict()), with storage the persistent id ('storage', <X>Storage, key, 'cpu', numel). Dtypes without
// a legacy storage class are written as torch >= 2.1 does: _rebuild_tensor_v3 on an UntypedStorage whose
// numel counts bytes, with the dtype after the hooks.
void write_tensor(pickle::PickleWriter& w, const catalog::LogicalTensor& t, size_t key) {
  const std::string_view storage_class = dtype_storage_class(t.dtype);
  const bool v3 = storage_class.empty();
  w.global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  const size_t n_args = v3 ? 7 : 6;
  w.begin_tuple(n_args);
  w.begin_tuple(5);
  w.shared_string("storage");
  w.global("torch", v3 ? "UntypedStorage" : storage_class);
  w.string(std::to_string(key));
  w.shared_string("cpu");
  w.integer(static_cast<int64_t>(v3 ? t.nbytes() : t.numel()));
  w.end_tuple(5);
  w.persistent_id();
  w.integer(0);
  // Contiguous strides as torch computes them: a zero-size dimension counts as 1.
  std::vector<int64_t> strides(t.shape.size());
  int64_t stride = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(t.shape[i], 1);
  }
  const auto int_tuple = [&](std::span<const int64_t> items) {
    w.begin_tuple(items.size());
    for (int64_t d : items) w.integer(d);
    w.end_tuple(items.size());
  };
  int_tuple(t.shape);
  int_tuple(strides);
  w.boolean(false);
  w.global("collections", "OrderedDict");
  w.begin_tuple(0);
  w.end_tuple(0);
  w.reduce();
  if (v3) w.global("torch", dtype_torch_name(t.dtype));
  w.end_tuple(n_args);
  w.reduce();
}

std::string data_pickle(const catalog::Catalog& catalog) {
  pickle::PickleWriter w;
  w.empty_dict();
  w.set_items(catalog.tensors.size(), [&](size_t i) {
    w.string(catalog.tensors[i].name);
    write_tensor(w, catalog.tensors[i], i);
  });
  return std::move(w).finish();
}

}  // namespace

VirtualFilePtr make_torch_save(std::shared_ptr<const catalog::Catalog> catalog,
                               const std::string& archive_name) {
  std::unordered_set<std::string_view> names;
  for (const auto& t : catalog->tensors)
    if (!names.insert(t.name).second)
      throw FormatError(fmt::format("torch.save view: tensor name {} appears twice", t.name));

  std::vector<ZipRecord> records;
  records.push_back({"data.pkl", data_pickle(*catalog)});
  records.push_back({".format_version", "1"});
  records.push_back({".storage_alignment", std::to_string(kZipAlignment)});
  records.push_back({"byteorder", "little"});
  for (size_t i = 0; i < catalog->tensors.size(); ++i)
    records.push_back({fmt::format("data/{}", i), {}, &catalog->tensors[i]});
  records.push_back({"version", "3\n"});

  ExtentBuilder out;
  append_zip(out, archive_name, records);
  return std::make_shared<ExtentFile>(std::move(out).finish(), std::move(catalog));
}

}  // namespace ckptfs::views
