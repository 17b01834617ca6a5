// A torch.save zip of {name: tensor} built from the catalog, laid out as torch writes it.
#include <fmt/format.h>

#include <unordered_set>

#include "ckptfs/error.hpp"
#include "views/torch_value.hpp"

namespace ckptfs::views {

VirtualFilePtr make_torch_save(std::shared_ptr<const catalog::Catalog> catalog,
                               const std::string& archive_name) {
  std::unordered_set<std::string_view> names;
  auto dict = pickle::make_value(pickle::Kind::Dict);
  for (size_t i = 0; i < catalog->tensors.size(); ++i) {
    const auto& t = catalog->tensors[i];
    if (!names.insert(t.name).second)
      throw FormatError(fmt::format("torch.save view: tensor name {} appears twice", t.name));
    auto name = pickle::make_value(pickle::Kind::String);
    name->text = t.name;
    dict->entries.emplace_back(std::move(name), catalog::tensor_value({catalog, i}));
  }
  return make_torch_save_value(*dict, archive_name);
}

}  // namespace ckptfs::views
