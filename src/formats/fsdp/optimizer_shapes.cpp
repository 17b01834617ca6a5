#include "formats/fsdp/optimizer_shapes.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckptfs/error.hpp"
#include "formats/dcp/dcp_items.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::formats::fsdp {

namespace {

constexpr std::string_view kState = "optimizer.state.";
constexpr std::string_view kGroups = "optimizer.param_groups.";

// The states that have their parameter's shape (Adam's moments, SGD's momentum, Adagrad's sum): factored
// or quantized states (Adafactor's exp_avg_sq_row, bitsandbytes' absmax1) have shapes of their own.
bool has_parameter_shape(std::string_view state) {
  return state == "exp_avg" || state == "exp_avg_sq" || state == "momentum_buffer" || state == "sum";
}

// "optimizer.param_groups.<g>.params"
bool is_group_params(const std::string& fqn) {
  return fqn.starts_with(kGroups) && fqn.ends_with(".params") && fqn.size() > kGroups.size() + 7;
}

}  // namespace

OptimizerRecord read_optimizer_record(io::FileSet& files, const std::filesystem::path& dir) {
  OptimizerRecord out;
  const auto metadata = dcp::metadata_files(files.source(), dir);
  if (metadata.empty()) return out;
  const dcp::ItemReader reader(files, dir, metadata.front());
  for (const auto& item : dcp::read_dir_metadata(files.source(), dir).items) {
    const auto last_dot = item.fqn.rfind('.');
    if (item.is_tensor && item.fqn.starts_with(kState) && last_dot > kState.size() &&
        has_parameter_shape(std::string_view(item.fqn).substr(last_dot + 1))) {
      const auto [it, added] =
          out.shapes.emplace(item.fqn.substr(kState.size(), last_dot - kState.size()), item.size);
      if (!added && it->second != item.size)
        throw FormatError(fmt::format("{}: {}: states of one parameter of shapes [{}] and [{}]",
                                      item.metadata_file.string(), item.fqn, fmt::join(it->second, ", "),
                                      fmt::join(item.size, ", ")));
    } else if (!item.is_tensor && is_group_params(item.fqn)) {
      const auto archive = reader.archive(item, item.location);
      const Field params = root_field(archive);
      for (size_t i = 0; i < params.size(); ++i) out.order.push_back(params.at(i).as_string());
    }
  }
  return out;
}

}  // namespace ckptfs::formats::fsdp
