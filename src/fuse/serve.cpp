// Session lifecycle: options -> session -> mount -> daemonise -> multithreaded loop -> unmount.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "ckptfs/error.hpp"
#include "ckptfs/fuse.hpp"
#include "ckptfs/live_stats.hpp"
#include "fuse/operations.hpp"
#include "io/runtime.hpp"

namespace ckptfs::fuse {

namespace {

struct SessionDeleter {
  void operator()(fuse_session* se) const { fuse_session_destroy(se); }
};
struct LoopConfigDeleter {
  void operator()(fuse_loop_config* config) const { fuse_loop_cfg_destroy(config); }
};

std::unique_ptr<fuse_session, SessionDeleter> new_session(const ServeOptions& options,
                                                          const fuse_lowlevel_ops& ops, Context& context) {
  std::vector<std::string> args = {"ckptfs", "-o", "ro,default_permissions"};
  for (const auto& option : options.fuse_options)
    if (option != "default_permissions") args[2] += "," + option;
  if (options.debug) args.emplace_back("-d");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &ops, sizeof ops, &context);
  fuse_opt_free_args(&fargs);
  // libfuse has printed which option it rejected.
  if (se == nullptr) throw Error(ExitCode::usage, fmt::format("invalid mount options: -o {}", args[2]));
  return std::unique_ptr<fuse_session, SessionDeleter>(se);
}

// mountinfo writes space, tab, newline and backslash in paths as \ooo (three octal digits).
std::string unescape_mountinfo(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      out +=
          static_cast<char>(((field[i + 1] - '0') << 6) | ((field[i + 2] - '0') << 3) | (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// Raises the readahead of the mount's bdi. Read from mountinfo, since a stat() of the mount point would
// wait for the loop that is not running yet. Best effort: without the privilege the kernel's default stays.
void set_read_ahead(const std::string& mountpoint, unsigned kb) {
  if (const auto mount = find_mount(mountpoint))
    std::ofstream(fmt::format("/sys/class/bdi/{}/read_ahead_kb", mount->device)) << kb;
}

// {path: bytes answered} of every file of the tree served now that was read (a file at two paths, a root
// view and tags/<latest>/, under its first).
nlohmann::json served_bytes(const Generation& generation) {
  nlohmann::json out = nlohmann::json::object();
  for (vfs::Ino ino = 1; ino <= generation.tree->node_count(); ++ino)
    if (const uint64_t bytes = generation.served[ino].load(std::memory_order_relaxed); bytes > 0)
      out[generation.tree->path(ino)] = bytes;
  return out;
}

// The kernel drops what a replaced tree changed. ENOENT (nothing cached there) is the common answer.
void invalidate(fuse_session* se, const Invalidations& changed) {
  for (const auto& [parent, name] : changed.entries)
    fuse_lowlevel_notify_inval_entry(se, parent, name.c_str(), name.size());
  for (KernelIno ino : changed.inodes) fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
}

}  // namespace

std::optional<MountEntry> find_mount(const std::string& mountpoint) {
  // id parent MAJ:MIN root mountpoint options [optional fields...] - type source superoptions
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::optional<MountEntry> found;
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point, field;
    if (!(fields >> id >> parent >> device >> root >> point) || unescape_mountinfo(point) != mountpoint)
      continue;
    while (fields >> field && field != "-") {
    }
    MountEntry entry{device, "", ""};
    fields >> entry.type >> entry.source;
    entry.source = unescape_mountinfo(entry.source);
    found = std::move(entry);  // later lines are mounted on top of earlier ones
  }
  return found;
}

std::string check_mountpoint(const std::string& mountpoint) {
  struct statx stx {};
  // AT_STATX_FORCE_SYNC: a FUSE mount whose server is gone still has its root's attributes cached.
  if (::statx(AT_FDCWD, mountpoint.c_str(), AT_STATX_FORCE_SYNC, STATX_TYPE, &stx) != 0) {
    const int err = errno;
    // ECONNABORTED: the same, while the dying server still holds /dev/fuse.
    if (err == ENOTCONN || err == ECONNABORTED)
      throw Error(ExitCode::mount_failed,
                  fmt::format("{}: {}: the server of the FUSE mount there is gone (killed?); run "
                              "`fusermount3 -u {}` first",
                              mountpoint, std::strerror(err), mountpoint));
    throw Error(ExitCode::mount_failed, fmt::format("{}: mount point: {}", mountpoint, std::strerror(err)));
  }
  if (!S_ISDIR(stx.stx_mode))
    throw Error(ExitCode::mount_failed, fmt::format("{}: mount point is not a directory", mountpoint));
  // As mountinfo spells it: symbolic links resolved (the kernel mounts on the directory they lead to).
  std::error_code ec;
  std::string canonical = std::filesystem::canonical(mountpoint, ec).string();
  if (ec) throw Error(ExitCode::mount_failed, fmt::format("{}: mount point: {}", mountpoint, ec.message()));
  if (const auto mount = find_mount(canonical); mount && mount->type == "fuse.ckptfs")
    throw Error(ExitCode::mount_failed,
                fmt::format("{}: already a ckptfs mount (of {}); unmount it first (fusermount3 -u {})",
                            mountpoint, mount->source, mountpoint));
  return canonical;
}

void serve(std::shared_ptr<const vfs::VirtualTree> tree, const ServeOptions& options, io::Runtime& runtime) {
  const bool foreground = options.foreground || options.debug;
  OpenFiles open_files;
  FailureLog failures;
  InodeTable inodes(std::move(tree));
  Context context{&inodes,
                  options.access,
                  static_cast<bool>(options.follow),
                  !foreground,
                  uint64_t{options.prefetch_mb} << 20,
                  runtime.remote_options().memory_bytes,
                  &open_files,
                  std::chrono::milliseconds(options.source_check_ms),
                  &failures};
  runtime.stats()->add_section("served", [&] { return served_bytes(*inodes.current()); });
  const struct Unregister {
    std::shared_ptr<io::LiveStats> stats;
    ~Unregister() { stats->remove_section("served"); }
  } unregister{runtime.stats()};
  const fuse_lowlevel_ops ops = make_operations();
  auto session = new_session(options, ops, context);
  fuse_session* se = session.get();
  if (fuse_session_mount(se, options.mountpoint.c_str()) != 0)
    throw Error(ExitCode::mount_failed,
                fmt::format("{}: mount failed (see the fuse: line above)", options.mountpoint));
  if (options.read_ahead_kb != 0) set_read_ahead(options.mountpoint, options.read_ahead_kb);
  // The mount is live: the daemon's parent exits 0 from here (libfuse's own readiness pipe).
  if (fuse_daemonize(foreground ? 1 : 0) != 0) {  // libfuse has said why
    fuse_session_unmount(se);
    throw Error(ExitCode::mount_failed,
                fmt::format("{}: cannot start the server in the background", options.mountpoint));
  }
  if (context.use_syslog) openlog("ckptfs", LOG_PID, LOG_DAEMON);
  // libfuse leaves a signal alone that the parent ignored (a background job of a non-interactive shell
  // starts with SIGINT ignored): SIGINT and SIGTERM must always unmount cleanly, so they get their
  // default disposition first (SIGHUP keeps nohup's).
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_unmount(se);
    throw Error(ExitCode::mount_failed, "cannot install signal handlers");
  }
  // After the fork: a thread does not survive fuse_daemonize.
  runtime.forked();
  std::jthread once_live;
  if (options.once_live)
    once_live = std::jthread([&] {
      if (const std::string warning = options.once_live(); !warning.empty()) log_error(context, warning);
    });
  std::jthread follow;
  if (options.follow)
    follow = std::jthread([&](std::stop_token stop) {
      options.follow(
          [&](std::shared_ptr<const vfs::VirtualTree> next) {
            inodes.replace(std::move(next), [&](const Invalidations& changed) { invalidate(se, changed); });
          },
          [&](const std::string& line) { log_error(context, line); }, stop);
    });
  std::unique_ptr<fuse_loop_config, LoopConfigDeleter> config(fuse_loop_cfg_create());
  fuse_loop_cfg_set_clone_fd(config.get(), 1);
  fuse_loop_cfg_set_max_threads(config.get(), options.max_threads);
  const int status = fuse_session_loop_mt(se, config.get());
  if (follow.joinable()) {  // before the session goes: it may be invalidating
    follow.request_stop();
    follow.join();
  }
  fuse_remove_signal_handlers(se);
  fuse_session_unmount(se);
  // A signal ends the loop with status = the signal number; only a negative status is a failure.
  if (status < 0)
    throw Error(ExitCode::failure, fmt::format("{}: session ended with an error", options.mountpoint));
}

}  // namespace ckptfs::fuse
