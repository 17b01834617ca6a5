// What the index holds of a Checkpoint: one field list per struct, run by both the Encoder and the
// Decoder (field_codec.hpp). A member added to a struct and not here fails to compile: add it here, in the
// order it is to be written, and bump kFormatVersion (index_file.hpp).
#pragma once

#include <stdexcept>
#include <tuple>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/torch.hpp"
#include "index/field_codec.hpp"
#include "io/decoded_item.hpp"
#include "torch/tensor_builder.hpp"

namespace ckptfs::index {

// The sources changed since the index was written (a file replaced, touched, added or removed): the
// bytes are sound, but the index no longer describes the checkpoint.
struct StaleIndex : FormatError {
  using FormatError::FormatError;
};

// For a check: a pointer every reader dereferences, so null is damage.
inline void require(bool present, const std::string& what) {
  if (!present) throw FormatError("index: " + what + " is missing");
}

template <>
inline constexpr DType kLastEnum<DType> = static_cast<DType>(kDTypeCount - 1);
template <>
inline constexpr pickle::Kind kLastEnum<pickle::Kind> = pickle::Kind::Native;
template <>
inline constexpr ViewRole kLastEnum<ViewRole> = ViewRole::hf;
template <>
inline constexpr catalog::ModelRole kLastEnum<catalog::ModelRole> = catalog::ModelRole::tied_alias;

// A source file as indexed: reopened on decoding, and trusted only with the identity it had; a decoded
// item (a compressed DCP item) is its backing file's range instead, with that file's identity.
struct FileRecord {
  std::filesystem::path path;
  io::FileIdentity identity;
  io::Origin origin;
  std::vector<io::Expectation> expectations;  // not checked yet: checked by the mount that loads the index
};

// A file (or an object, found in its source's listing taken at this mount) opened again from `source`, the
// loading command's (decode_checkpoint's), trusted only with the identity it had when indexed.
inline io::FilePtr reopened(const FileRecord& r, const io::Source* source) {
  if (source == nullptr) throw StaleIndex(r.path.string() + ": no source to reopen it from");
  io::FilePtr file;
  try {
    file = source->open(r.path);
  } catch (const SourceError& e) {
    throw StaleIndex(e.what());
  }
  if (!(file->identity() == r.identity)) throw StaleIndex(r.path.string() + " changed since it was indexed");
  return file;
}

template <>
struct Wire<io::File> {
  using type = FileRecord;
  static FileRecord to(const io::File& f) { return {f.path(), f.identity(), f.origin(), f.expectations()}; }
  static io::FilePtr from(FileRecord&& r, const Decoder& in) {
    const auto source = in.given<const io::Source>();
    io::FilePtr file =
        std::visit(Overloaded{
                       [&](const io::OnDisk&) { return reopened(r, source.get()); },
                       [](const io::Decoded& d) { return io::File::decoded(d.item); },  // checked non-null
                       [&](const io::Remote&) { return reopened(r, source.get()); },
                   },
                   r.origin);
    // Only an object defers its checks (a local file checks them at parse): any other is damage.
    if (!r.expectations.empty() && !file->is_remote())
      throw FormatError("index: " + r.path.string() + " has expectations but is not an object of a store");
    for (io::Expectation& e : r.expectations) file->expect(std::move(e));
    return file;
  }
};

struct DecodedRecord {
  io::FilePtr backing;
  uint64_t offset = 0, length = 0, size = 0;
};

template <>
struct Wire<io::DecodedItem> {
  using type = DecodedRecord;
  static DecodedRecord to(const io::DecodedItem& d) {
    return {d.backing(), d.offset(), d.length(), d.size()};
  }
  static std::shared_ptr<const io::DecodedItem> from(DecodedRecord&& r) {
    if (!r.backing) throw FormatError("index: a decoded item has no file");
    return std::make_shared<const io::DecodedItem>(std::move(r.backing), r.offset, r.length, r.size);
  }
};

// A box assembly is rebuilt from its boxes (its grid is derived from them).
template <>
struct Wire<catalog::BoxAssembly> {
  using type = std::pair<std::vector<int64_t>, std::vector<catalog::Box>>;
  static type to(const catalog::BoxAssembly& a) { return {a.shape(), a.boxes()}; }
  static std::shared_ptr<const catalog::BoxAssembly> from(type&& w) {
    return std::make_shared<const catalog::BoxAssembly>("a boxed tensor of the index", std::move(w.first),
                                                        std::move(w.second));
  }
};

template <>
struct Fields<io::FileIdentity> {
  static auto of(auto& t) {
    return std::tie(t.device, t.inode, t.size, t.mtime_ns, t.ctime_ns, t.etag, t.last_modified);
  }
};
// Neither keeps anything of its own in the index: both are opened again from the record's path.
template <>
inline constexpr bool kMadeAgain<io::OnDisk> = true;
template <>
inline constexpr bool kMadeAgain<io::Remote> = true;
template <>
struct Fields<io::Decoded> {
  static auto of(auto& t) { return std::tie(t.item); }
  static void check(const io::Decoded& t) { require(t.item != nullptr, "a decoded item"); }
};
template <>
struct Fields<DecodedRecord> {
  static auto of(auto& t) { return std::tie(t.backing, t.offset, t.length, t.size); }
};
template <>
struct Fields<io::Expectation> {
  static auto of(auto& t) { return std::tie(t.guard_begin, t.guard_end, t.pieces, t.what); }
};
template <>
struct Fields<FileRecord> {
  static auto of(auto& t) { return std::tie(t.path, t.identity, t.origin, t.expectations); }
};

template <>
struct Fields<pickle::Value> {
  static auto of(auto& v) {
    return std::tie(v.kind, v.boolean, v.integer, v.real, v.text, v.items, v.entries, v.module, v.name,
                    v.member, v.args, v.state, v.kwargs, v.made_by_new, v.native);
  }
  static void check(const pickle::Value& v) {
    if ((v.kind == pickle::Kind::Native) != v.native.has_value())
      throw FormatError("index: a value's native does not match its kind");
    if (v.native)
      require(std::visit([](const auto& native) { return native != nullptr; }, *v.native), "a native");
  }
};
template <>
struct Fields<torch::StorageSpan> {
  static auto of(auto& s) { return std::tie(s.file, s.offset, s.nbytes); }
};
template <>
struct Fields<torch::SourceTensor> {
  static auto of(auto& s) {
    return std::tie(s.storage, s.dtype, s.shape, s.strides, s.storage_offset, s.requires_grad);
  }
  static void check(const torch::SourceTensor& s) {
    if (s.shape.size() != s.strides.size())
      throw FormatError("index: a tensor's shape and strides differ in length");
  }
};
template <>
struct Fields<torch::StorageRef> {
  static auto of(auto& s) { return std::tie(s.key, s.dtype, s.offset, s.nbytes); }
};
template <>
struct Fields<torch::TensorObject> {
  static auto of(auto& t) { return std::tie(t.tensor); }
};
template <>
struct Fields<catalog::TensorRef> {
  static auto of(auto& r) { return std::tie(r.catalog, r.index); }
  static void check(const catalog::TensorRef& r) {
    if (r.catalog && r.index >= r.catalog->tensors.size())
      throw FormatError("index: a tensor handle points past its catalog");
  }
};
template <>
struct Fields<catalog::TensorValue> {
  static auto of(auto& t) { return std::tie(t.tensor, t.shape, t.requires_grad); }
  static void check(const catalog::TensorValue& t) {
    require(static_cast<bool>(t.tensor), "a tensor value's tensor");
  }
};

template <>
struct Fields<catalog::Piece> {
  static auto of(auto& p) { return std::tie(p.dst_begin, p.count, p.file, p.src_offset, p.src_dtype); }
  static void check(const catalog::Piece& p) { require(p.file != nullptr, "a piece's file"); }
};
template <>
struct Fields<catalog::Box> {
  static auto of(auto& b) { return std::tie(b.offsets, b.sizes, b.source, b.inner); }
  static void check(const catalog::Box& b) { require(b.inner || b.source.storage.file, "a box's file"); }
};
// A tensor's source: the variant's index, then the form's fields.
template <>
struct Fields<catalog::FlatRuns> {
  static auto of(auto& r) { return std::tie(r.pieces); }
};
template <>
struct Fields<catalog::Boxed> {
  static auto of(auto& b) { return std::tie(b.assembly); }
  static void check(const catalog::Boxed& b) { require(b.assembly != nullptr, "a box assembly"); }
};
template <>
struct Fields<catalog::Transposed> {
  static auto of(auto& t) { return std::tie(t.of, t.tiles); }
  static void check(const catalog::Transposed& t) {
    require(t.of != nullptr, "a transposed tensor's source");
  }
};
// A transposed tensor's tiles are the loading command's (decode_checkpoint's transpose_cache).
template <>
inline constexpr bool kMadeAgain<catalog::TransposeCache> = true;
template <>
struct Fields<catalog::LogicalTensor> {
  static auto of(auto& t) { return std::tie(t.name, t.dtype, t.shape, t.source, t.origin, t.role); }
  static void check(const catalog::LogicalTensor& t) { catalog::validate(t); }
};
template <>
struct Fields<catalog::Catalog> {
  static auto of(auto& t) { return std::tie(t.tensors); }
};

template <>
struct Fields<Topology> {
  static auto of(auto& t) { return std::tie(t.dp, t.tp, t.pp, t.ep, t.experts, t.optimizer, t.train_dtype); }
};
template <>
struct Fields<UniversalParam> {
  static auto of(auto& p) { return std::tie(p.name, p.fp32, p.state, p.step, p.merge_keys); }
  static void check(const UniversalParam& p) {
    require(static_cast<bool>(p.fp32), "a universal parameter's master");
    for (const auto& s : p.state) require(static_cast<bool>(s), "a universal parameter's state");
  }
};
template <>
struct Fields<UniversalPlan> {
  static auto of(auto& p) {
    return std::tie(p.bare_tensors, p.state_keys, p.params, p.optimizer_state, p.model_state_files);
  }
  static void check(const UniversalPlan& p) {
    for (const auto& param : p.params)
      if (param.state.size() != p.state_keys.size())
        throw FormatError("index: a universal parameter's state keys differ");
  }
};
template <>
struct Fields<DeepSpeedTag> {
  static auto of(auto& d) { return std::tie(d.zero_stage, d.universal); }
};
template <>
struct Fields<StateFile> {
  static auto of(auto& s) { return std::tie(s.path, s.value); }
};
template <>
struct Fields<WrittenText> {
  static auto of(auto& w) { return std::tie(w.text); }
};
template <>
struct Fields<PassedThrough> {
  static auto of(auto& p) { return std::tie(p.source); }
};
template <>
struct Fields<ExtraFile> {
  static auto of(auto& e) { return std::tie(e.path, e.bytes); }
};
template <>
struct Fields<Tag> {
  static auto of(auto& t) {
    return std::tie(t.name, t.dir, t.format, t.topology, t.models, t.states, t.deepspeed, t.state_files,
                    t.side_files, t.extra_files, t.files, t.notes);
  }
};
template <>
struct Fields<LeftOutTag> {
  static auto of(auto& l) { return std::tie(l.name, l.error); }
};
template <>
struct Fields<Checkpoint> {
  static auto of(auto& cp) {
    return std::tie(cp.framework, cp.root, cp.latest, cp.tags, cp.side_files, cp.left_out, cp.in_progress);
  }
};

}  // namespace ckptfs::index
