#include "index/checkpoint_codec.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "io/decoded_item.hpp"
#include "index/byte_stream.hpp"

namespace ckptfs::index {

namespace fs = std::filesystem;
using catalog::Catalog;
using catalog::LogicalTensor;

namespace {

enum NativeKind : uint64_t { kNoNative = 0, kTensorValue = 1, kSourceTensor = 2 };
enum TensorKind : uint64_t { kPieces = 0, kBoxes = 1, kTransposed = 2 };
// A new form of catalog::TensorSource needs its kind here and in the decoder's switch; view roles are
// written as ViewRole's values, ViewRole::hf the last.
static_assert(std::variant_size_v<catalog::TensorSource> == 3);

// What decides the tags besides the files the catalogs read: the directories walked (an added or
// removed entry changes a directory's mtime) and the regular files directly in them (a tracker file
// rewritten in place).
struct Watched {
  fs::path path;
  bool directory = false;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
};

std::optional<Watched> watch(const fs::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return Watched{path, S_ISDIR(st.st_mode), st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec,
                 static_cast<uint64_t>(st.st_ino), S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size)};
}

bool same(const Watched& a, const Watched& b) {
  return a.directory == b.directory && a.mtime_ns == b.mtime_ns && a.inode == b.inode && a.size == b.size;
}

std::vector<Watched> watched_of(const Checkpoint& cp) {
  std::set<fs::path> dirs = {cp.root};
  for (const auto& tag : cp.tags) {
    dirs.insert(tag.dir);
    for (const auto& f : tag.files) dirs.insert(f.parent_path());
  }
  std::set<fs::path> paths = dirs;
  for (const auto& d : dirs) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.is_regular_file(ec)) paths.insert(e.path());
  }
  std::vector<Watched> out;
  for (const auto& p : paths)
    if (auto w = watch(p)) out.push_back(std::move(*w));
  return out;
}

class Encoder {
 public:
  std::string encode(const Checkpoint& cp) {
    // Tables first: what later sections refer to by number.
    for (const auto& tag : cp.tags) {
      for (const auto& [name, c] : tag.named_catalogs()) add_catalog(c);
      if (const auto plan = tag.universal()) {
        for (const auto& p : plan->params) {
          add_catalog(p.fp32.catalog);
          for (const auto& s : p.state) add_catalog(s.catalog);
          add_catalogs_of(p.step);
        }
        add_catalogs_of(plan->optimizer_state);
      }
      for (const auto& s : tag.state_files) add_catalogs_of(s.value);
    }
    for (const auto* c : catalogs_)
      for (const auto& t : c->tensors) collect_pool(t);
    ByteWriter body;
    out_ = &body;
    encode_pool_and_catalogs();
    encode_checkpoint_fields(cp);
    // The header: files and watched paths, then the body.
    ByteWriter all;
    all.u64(files_.size());
    for (const auto* f : files_) {
      const auto& id = f->identity();
      all.text(f->path().string());
      all.u64(id.device);
      all.u64(id.inode);
      all.u64(id.size);
      all.i64(id.mtime_ns);
      all.i64(id.ctime_ns);
      // A decoded item: the file holding it (listed before it) and where; its identity is that file's.
      std::visit(Overloaded{
                     [&](const io::OnDisk&) { all.boolean(false); },
                     [&](const io::Decoded& decoded) {
                       const io::DecodedItem& d = *decoded.item;
                       all.boolean(true);
                       all.u64(file_id_.at(d.backing().get()));
                       all.u64(d.offset());
                       all.u64(d.length());
                       all.u64(d.size());
                     },
                 },
                 f->origin());
    }
    const auto watched = watched_of(cp);
    all.u64(watched.size());
    for (const auto& w : watched) {
      all.text(w.path.string());
      all.boolean(w.directory);
      all.i64(w.mtime_ns);
      all.u64(w.inode);
      all.u64(w.size);
    }
    all.data() += body.data();
    return std::move(all.data());
  }

 private:
  void add_catalog(const CatalogPtr& c) {
    if (!c || catalog_id_.contains(c.get())) return;
    catalog_id_.emplace(c.get(), catalogs_.size());
    catalogs_.push_back(c.get());
  }

  // The catalogs whose tensors a value tree holds by handle (catalog::TensorValue), walked with a stack of
  // its own (a tree may be deeper than the call stack allows).
  void add_catalogs_of(const pickle::ValuePtr& root) {
    std::vector<const pickle::Value*> todo = {root.get()};
    while (!todo.empty()) {
      const pickle::Value* v = todo.back();
      todo.pop_back();
      if (v == nullptr || !walked_.insert(v).second) continue;
      if (const auto* tv = dynamic_cast<const catalog::TensorValue*>(v->native.get())) add_catalog(tv->tensor.catalog);
      for (const auto& item : v->items) todo.push_back(item.get());
      for (const auto& [k, val] : v->entries) todo.insert(todo.end(), {k.get(), val.get()});
      todo.insert(todo.end(), {v->args.get(), v->state.get(), v->kwargs.get()});
    }
  }

  // Tensors that others are built on (a box's inner tensor, a transposed tensor's source), dependencies
  // first.
  void collect_pool(const LogicalTensor& t) {
    const auto visit = [&](const std::shared_ptr<const LogicalTensor>& p) {
      if (!p || pool_id_.contains(p.get())) return;
      collect_pool(*p);
      pool_id_.emplace(p.get(), pool_.size());
      pool_.push_back(p.get());
    };
    std::visit(Overloaded{
                   [](const catalog::FlatRuns&) {},
                   [&](const catalog::Boxed& boxed) {
                     for (const auto& b : boxed.assembly->boxes()) visit(b.inner);
                   },
                   [&](const catalog::Transposed& transposed) { visit(transposed.of); },
               },
               t.source);
  }

  size_t file_id(const io::FilePtr& f) {
    std::visit(Overloaded{
                   [](const io::OnDisk&) {},
                   [&](const io::Decoded& decoded) { file_id(decoded.item->backing()); },  // its file first
               },
               f->origin());
    auto [it, inserted] = file_id_.try_emplace(f.get(), files_.size());
    if (inserted) files_.push_back(f.get());
    return it->second;
  }

  void source_tensor(const torch::SourceTensor& s) {
    out_->u64(s.storage.file ? file_id(s.storage.file) + 1 : 0);
    out_->u64(s.storage.offset);
    out_->u64(s.storage.nbytes);
    out_->u64(static_cast<uint64_t>(s.dtype));
    out_->ints(s.shape);
    out_->ints(s.strides);
    out_->i64(s.storage_offset);
    out_->boolean(s.requires_grad);
  }

  void tensor(const LogicalTensor& t) {
    out_->text(t.name);
    out_->u64(static_cast<uint64_t>(t.dtype));
    out_->ints(t.shape);
    out_->text(t.origin);
    std::visit(Overloaded{
                   [&](const catalog::FlatRuns& flat) {
                     out_->u64(kPieces);
                     out_->u64(flat.pieces.size());
                     for (const auto& p : flat.pieces) {
                       out_->u64(p.dst_begin);
                       out_->u64(p.count);
                       out_->u64(file_id(p.file));
                       out_->u64(p.src_offset);
                       out_->u64(static_cast<uint64_t>(p.src_dtype));
                     }
                   },
                   [&](const catalog::Boxed& boxed) {
                     out_->u64(kBoxes);
                     out_->u64(boxed.assembly->boxes().size());
                     for (const auto& b : boxed.assembly->boxes()) {
                       out_->ints(b.offsets);
                       out_->ints(b.sizes);
                       source_tensor(b.source);
                       out_->u64(b.inner ? pool_id_.at(b.inner.get()) + 1 : 0);
                     }
                   },
                   [&](const catalog::Transposed& transposed) {
                     out_->u64(kTransposed);
                     out_->u64(pool_id_.at(transposed.of.get()));
                   },
               },
               t.source);
  }

  void encode_pool_and_catalogs() {
    out_->u64(pool_.size());
    for (const auto* t : pool_) tensor(*t);
    out_->u64(catalogs_.size());
    for (const auto* c : catalogs_) {
      out_->u64(c->tensors.size());
      for (const auto& t : c->tensors) tensor(t);
    }
  }

  // A tensor by handle: its catalog's number and its index there.
  void tensor_ref(const catalog::TensorRef& t) {
    auto it = t ? catalog_id_.find(t.catalog.get()) : catalog_id_.end();
    if (it == catalog_id_.end())
      throw UnsupportedError(fmt::format("index: tensor {} is in none of the tag's catalogs", t ? t->name : "(null)"));
    out_->u64(it->second);
    out_->u64(t.index);
  }

  // A value tree (shared subtrees once: later uses refer to the first).
  void value(const pickle::ValuePtr& v) {
    if (!v) {
      out_->u64(0);
      return;
    }
    if (auto it = value_id_.find(v.get()); it != value_id_.end()) {
      out_->u64(2);
      out_->u64(it->second);
      return;
    }
    out_->u64(1);
    value_id_.emplace(v.get(), value_id_.size());
    out_->u64(static_cast<uint64_t>(v->kind));
    out_->boolean(v->boolean);
    out_->i64(v->integer);
    out_->real(v->real);
    out_->text(v->text);
    out_->u64(v->items.size());
    for (const auto& item : v->items) value(item);
    out_->u64(v->entries.size());
    for (const auto& [k, val] : v->entries) {
      value(k);
      value(val);
    }
    out_->text(v->module);
    out_->text(v->name);
    out_->text(v->member);
    value(v->args);
    value(v->state);
    value(v->kwargs);
    out_->boolean(v->made_by_new);
    if (!v->native) {
      out_->u64(kNoNative);
    } else if (const auto* tv = dynamic_cast<const catalog::TensorValue*>(v->native.get())) {
      out_->u64(kTensorValue);
      tensor_ref(tv->tensor);
      out_->ints(tv->shape);
      out_->boolean(tv->requires_grad);
    } else if (const auto* to = dynamic_cast<const torch::TensorObject*>(v->native.get())) {
      out_->u64(kSourceTensor);
      source_tensor(to->tensor);
    } else {
      throw UnsupportedError("index: a value holds " + v->native->describe() + ", which the index cannot encode");
    }
  }

  void paths(const std::vector<fs::path>& list) {
    out_->u64(list.size());
    for (const auto& p : list) out_->text(p.string());
  }


  void universal(const UniversalPlan& plan) {
    out_->boolean(plan.bare_tensors);
    out_->u64(plan.state_keys.size());
    for (const auto& k : plan.state_keys) out_->text(k);
    out_->u64(plan.params.size());
    for (const auto& p : plan.params) {
      out_->text(p.name);
      tensor_ref(p.fp32);
      out_->u64(p.state.size());
      for (const auto& s : p.state) tensor_ref(s);
      value(p.step);
      out_->boolean(p.merge_keys.has_value());
      if (p.merge_keys) {
        out_->u64(p.merge_keys->size());
        for (const auto& [k, v] : *p.merge_keys) {
          out_->text(k);
          value(v);
        }
      }
    }
    value(plan.optimizer_state);
    paths(plan.model_state_files);
  }

  void encode_checkpoint_fields(const Checkpoint& cp) {
    out_->text(cp.framework);
    out_->text(cp.root.string());
    out_->text(cp.latest);
    paths(cp.side_files);
    out_->u64(cp.tags.size());
    for (const auto& tag : cp.tags) {
      out_->text(tag.name);
      out_->text(tag.dir.string());
      out_->text(tag.format);
      const auto& t = tag.topology;
      out_->i64(t.dp);
      out_->i64(t.tp);
      out_->i64(t.pp);
      out_->i64(t.ep);
      out_->i64(t.experts);
      out_->text(t.optimizer);
      out_->u64(static_cast<uint64_t>(t.train_dtype));
      out_->u64(tag.models.size());
      for (const auto& [folder, roles] : tag.models) {
        out_->text(folder);
        out_->u64(roles.size());
        for (const auto& [role, c] : roles) {
          out_->u64(static_cast<uint64_t>(role));
          out_->u64(catalog_id_.at(c.get()));
        }
      }
      out_->u64(tag.states.size());
      for (const auto& [state, c] : tag.states) {
        out_->text(state);
        out_->u64(catalog_id_.at(c.get()));
      }
      out_->boolean(tag.deepspeed.has_value());
      if (tag.deepspeed) {
        out_->i64(tag.deepspeed->zero_stage);
        out_->boolean(tag.deepspeed->universal != nullptr);
        if (tag.deepspeed->universal) universal(*tag.deepspeed->universal);
      }
      out_->u64(tag.state_files.size());
      for (const auto& s : tag.state_files) {
        out_->text(s.path);
        value(s.value);
      }
      paths(tag.side_files);
      out_->u64(tag.extra_files.size());
      for (const auto& e : tag.extra_files) {
        out_->text(e.path);
        out_->text(e.text);
        out_->text(e.source.string());
      }
      paths(tag.files);
      out_->u64(tag.notes.size());
      for (const auto& n : tag.notes) out_->text(n);
    }
    out_->u64(cp.left_out.size());
    for (const auto& l : cp.left_out) {
      out_->text(l.name);
      out_->text(l.error);
    }
  }

  ByteWriter* out_ = nullptr;
  std::vector<const io::File*> files_;
  std::unordered_map<const io::File*, size_t> file_id_;
  std::vector<const Catalog*> catalogs_;
  std::unordered_map<const Catalog*, size_t> catalog_id_;
  std::unordered_set<const pickle::Value*> walked_;
  std::vector<const LogicalTensor*> pool_;
  std::unordered_map<const LogicalTensor*, size_t> pool_id_;
  std::unordered_map<const pickle::Value*, size_t> value_id_;
};

class Decoder {
 public:
  explicit Decoder(std::string_view data) : in_(data) {}

  Checkpoint decode() {
    check_files();
    check_watched();
    decode_pool_and_catalogs();
    Checkpoint cp = decode_checkpoint_fields();
    if (!in_.done()) in_.fail("bytes left after the checkpoint");
    return cp;
  }

 private:
  DType dtype() {
    const uint64_t d = in_.u64();
    if (d > static_cast<uint64_t>(DType::C128)) in_.fail("an unknown dtype");
    return static_cast<DType>(d);
  }

  void check_files() {
    const uint64_t n = in_.count(6);
    for (uint64_t i = 0; i < n; ++i) {
      const fs::path path = in_.text();
      io::FileIdentity id;
      id.device = in_.u64();
      id.inode = in_.u64();
      id.size = in_.u64();
      id.mtime_ns = in_.i64();
      id.ctime_ns = in_.i64();
      if (in_.boolean()) {
        const uint64_t backing = in_.u64();
        if (backing >= files_.size()) in_.fail("a decoded item's file is not listed before it");
        const uint64_t offset = in_.u64(), length = in_.u64(), size = in_.u64();
        files_.push_back(io::File::decoded(
            std::make_shared<const io::DecodedItem>(files_[backing], offset, length, size)));
        continue;
      }
      io::FilePtr file;
      try {
        file = io::File::open(path);
      } catch (const SourceError& e) {
        throw StaleIndex(e.what());
      }
      if (!(file->identity() == id)) throw StaleIndex(path.string() + " changed since it was indexed");
      files_.push_back(std::move(file));
    }
  }

  void check_watched() {
    const uint64_t n = in_.count(5);
    for (uint64_t i = 0; i < n; ++i) {
      Watched w;
      w.path = in_.text();
      w.directory = in_.boolean();
      w.mtime_ns = in_.i64();
      w.inode = in_.u64();
      w.size = in_.u64();
      const auto now = watch(w.path);
      if (!now || !same(*now, w)) throw StaleIndex(w.path.string() + " changed since it was indexed");
    }
  }

  io::FilePtr file(size_t id) { return files_.at(id); }

  torch::SourceTensor source_tensor() {
    torch::SourceTensor s;
    const uint64_t f = in_.u64();
    if (f > files_.size()) in_.fail("a reference points outside its table");
    if (f > 0) s.storage.file = files_[f - 1];
    s.storage.offset = in_.u64();
    s.storage.nbytes = in_.u64();
    s.dtype = dtype();
    s.shape = in_.ints();
    s.strides = in_.ints();
    s.storage_offset = in_.i64();
    s.requires_grad = in_.boolean();
    if (s.shape.size() != s.strides.size()) in_.fail("a tensor's shape and strides differ in length");
    return s;
  }

  LogicalTensor tensor() {
    LogicalTensor t;
    t.name = in_.text();
    t.dtype = dtype();
    t.shape = in_.ints();
    t.origin = in_.text();
    switch (in_.u64()) {
      case kTransposed:
        t.source = catalog::Transposed{pool_.at(in_.index(pool_.size()))};
        break;
      case kBoxes: {
        std::vector<catalog::Box> boxes(in_.count(4));
        for (auto& b : boxes) {
          b.offsets = in_.ints();
          b.sizes = in_.ints();
          b.source = source_tensor();
          const uint64_t inner = in_.u64();
          if (inner > pool_.size()) in_.fail("a reference points outside its table");
          if (inner > 0) b.inner = pool_[inner - 1];
        }
        t.source = catalog::Boxed{std::make_shared<catalog::BoxAssembly>(t.name, t.shape, std::move(boxes))};
        break;
      }
      case kPieces: {
        catalog::FlatRuns flat;
        flat.pieces.resize(in_.count(5));
        for (auto& p : flat.pieces) {
          p.dst_begin = in_.u64();
          p.count = in_.u64();
          p.file = file(in_.index(files_.size()));
          p.src_offset = in_.u64();
          p.src_dtype = dtype();
        }
        t.source = std::move(flat);
        break;
      }
      default:
        in_.fail("an unknown tensor kind");
    }
    catalog::validate(t);
    return t;
  }

  void decode_pool_and_catalogs() {
    const uint64_t pooled = in_.count(6);
    for (uint64_t i = 0; i < pooled; ++i) pool_.push_back(std::make_shared<LogicalTensor>(tensor()));
    const uint64_t catalogs = in_.count(1);
    for (uint64_t i = 0; i < catalogs; ++i) {
      auto c = std::make_shared<Catalog>();
      c->tensors.resize(in_.count(6));
      for (auto& t : c->tensors) t = tensor();
      catalogs_.push_back(std::move(c));
    }
  }

  catalog::TensorRef tensor_ref() {
    const auto& c = catalogs_.at(in_.index(catalogs_.size()));
    return {c, in_.index(c->tensors.size())};
  }

  pickle::ValuePtr value() {
    switch (in_.u64()) {
      case 0:
        return nullptr;
      case 2:
        return values_.at(in_.index(values_.size()));
      case 1:
        break;
      default:
        in_.fail("an unknown value tag");
    }
    if (depth_ > kMaxDepth) in_.fail("values nested too deep");
    struct Nesting {
      int& depth;
      explicit Nesting(int& d) : depth(++d) {}
      ~Nesting() { --depth; }
    } nesting(depth_);
    auto v = std::make_shared<pickle::Value>();
    values_.push_back(v);
    const uint64_t kind = in_.u64();
    if (kind > static_cast<uint64_t>(pickle::Kind::Native)) in_.fail("an unknown value kind");
    v->kind = static_cast<pickle::Kind>(kind);
    v->boolean = in_.boolean();
    v->integer = in_.i64();
    v->real = in_.real();
    v->text = in_.text();
    v->items.resize(in_.count(1));
    for (auto& item : v->items) item = value();
    v->entries.resize(in_.count(2));
    for (auto& [k, val] : v->entries) {
      k = value();
      val = value();
    }
    v->module = in_.text();
    v->name = in_.text();
    v->member = in_.text();
    v->args = value();
    v->state = value();
    v->kwargs = value();
    v->made_by_new = in_.boolean();
    switch (in_.u64()) {
      case kNoNative:
        break;
      case kTensorValue: {
        auto tv = std::make_shared<catalog::TensorValue>();
        tv->tensor = tensor_ref();
        tv->shape = in_.ints();
        tv->requires_grad = in_.boolean();
        v->native = std::move(tv);
        break;
      }
      case kSourceTensor: {
        auto to = std::make_shared<torch::TensorObject>();
        to->tensor = source_tensor();
        v->native = std::move(to);
        break;
      }
      default:
        in_.fail("an unknown native value");
    }
    return v;
  }

  std::vector<fs::path> paths() {
    std::vector<fs::path> out(in_.count(1));
    for (auto& p : out) p = in_.text();
    return out;
  }


  std::shared_ptr<const UniversalPlan> universal() {
    auto plan = std::make_shared<UniversalPlan>();
    plan->bare_tensors = in_.boolean();
    plan->state_keys.resize(in_.count(1));
    for (auto& k : plan->state_keys) k = in_.text();
    plan->params.resize(in_.count(4));
    for (auto& p : plan->params) {
      p.name = in_.text();
      p.fp32 = tensor_ref();
      p.state.resize(in_.count(2));
      for (auto& s : p.state) s = tensor_ref();
      p.step = value();
      if (in_.boolean()) {
        p.merge_keys.emplace(in_.count(2));
        for (auto& [k, v] : *p.merge_keys) {
          k = in_.text();
          v = value();
        }
      }
    }
    plan->optimizer_state = value();
    plan->model_state_files = paths();
    return plan;
  }

  Checkpoint decode_checkpoint_fields() {
    Checkpoint cp;
    cp.framework = in_.text();
    cp.root = in_.text();
    cp.latest = in_.text();
    cp.side_files = paths();
    cp.tags.resize(in_.count(8));
    for (auto& tag : cp.tags) {
      tag.name = in_.text();
      tag.dir = in_.text();
      tag.format = in_.text();
      auto& t = tag.topology;
      t.dp = static_cast<int>(in_.i64());
      t.tp = static_cast<int>(in_.i64());
      t.pp = static_cast<int>(in_.i64());
      t.ep = static_cast<int>(in_.i64());
      t.experts = static_cast<int>(in_.i64());
      t.optimizer = in_.text();
      t.train_dtype = dtype();
      const uint64_t models = in_.count(2);
      for (uint64_t i = 0; i < models; ++i) {
        auto& roles = tag.models[in_.text()];
        const uint64_t n = in_.count(2);
        for (uint64_t k = 0; k < n; ++k) {
          const auto role = static_cast<ViewRole>(in_.index(static_cast<size_t>(ViewRole::hf) + 1));
          roles[role] = catalogs_.at(in_.index(catalogs_.size()));
        }
      }
      const uint64_t states = in_.count(2);
      for (uint64_t i = 0; i < states; ++i) {
        std::string state = in_.text();
        tag.states[std::move(state)] = catalogs_.at(in_.index(catalogs_.size()));
      }
      if (in_.boolean()) {
        auto& ds = tag.deepspeed.emplace();
        ds.zero_stage = static_cast<int>(in_.i64());
        if (in_.boolean()) ds.universal = universal();
      }
      tag.state_files.resize(in_.count(3));
      for (auto& s : tag.state_files) {
        s.path = in_.text();
        s.value = value();
      }
      tag.side_files = paths();
      tag.extra_files.resize(in_.count(3));
      for (auto& e : tag.extra_files) {
        e.path = in_.text();
        e.text = in_.text();
        e.source = in_.text();
      }
      tag.files = paths();
      tag.notes.resize(in_.count(1));
      for (auto& n : tag.notes) n = in_.text();
    }
    cp.left_out.resize(in_.count(2));
    for (auto& l : cp.left_out) {
      l.name = in_.text();
      l.error = in_.text();
    }
    return cp;
  }

  static constexpr int kMaxDepth = 1024;  // the unpickler's own nesting bound is 512
  int depth_ = 0;
  ByteReader in_;
  std::vector<io::FilePtr> files_;
  std::vector<std::shared_ptr<const LogicalTensor>> pool_;
  std::vector<std::shared_ptr<Catalog>> catalogs_;
  std::vector<pickle::ValuePtr> values_;
};

}  // namespace

std::string encode_checkpoint(const Checkpoint& checkpoint) { return Encoder().encode(checkpoint); }

Checkpoint decode_checkpoint(std::string_view data) { return Decoder(data).decode(); }

}  // namespace ckptfs::index
