// Session lifecycle: options -> session -> mount -> daemonise -> multithreaded loop -> unmount.
#include <fmt/format.h>
#include <syslog.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "ckptfs/error.hpp"
#include "ckptfs/fuse.hpp"
#include "fuse/operations.hpp"

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
  std::vector<std::string> args = {"ckptfs", "-o", "ro"};
  for (const auto& option : options.fuse_options) args[2] += "," + option;
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

// Raises the readahead of the mount's bdi ("MAJ:MIN", field 3 of its /proc/self/mountinfo line). Read
// from mountinfo, since a stat() of the mount point would wait for the loop that is not running yet.
// Best effort: without the privilege the kernel's default stays.
void set_read_ahead(const std::string& mountpoint, unsigned kb) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string bdi;
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point;
    if (fields >> id >> parent >> device >> root >> point && point == mountpoint) bdi = device;
  }
  if (!bdi.empty()) std::ofstream(fmt::format("/sys/class/bdi/{}/read_ahead_kb", bdi)) << kb;
}

}  // namespace

void serve(const vfs::VirtualTree& tree, const ServeOptions& options) {
  const bool foreground = options.foreground || options.debug;
  Context context{&tree, ::getuid(), ::getgid(), !foreground};
  const fuse_lowlevel_ops ops = make_operations();
  auto session = new_session(options, ops, context);
  fuse_session* se = session.get();
  if (fuse_session_mount(se, options.mountpoint.c_str()) != 0)
    throw Error(ExitCode::mount_failed,
                fmt::format("{}: mount failed (see the fuse: line above)", options.mountpoint));
  if (options.read_ahead_kb != 0) set_read_ahead(options.mountpoint, options.read_ahead_kb);
  // The mount is live: the daemon's parent exits 0 from here (libfuse's own readiness pipe).
  fuse_daemonize(foreground ? 1 : 0);
  if (context.use_syslog) openlog("ckptfs", LOG_PID, LOG_DAEMON);
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_unmount(se);
    throw Error(ExitCode::mount_failed, "cannot install signal handlers");
  }
  std::unique_ptr<fuse_loop_config, LoopConfigDeleter> config(fuse_loop_cfg_create());
  fuse_loop_cfg_set_clone_fd(config.get(), 1);
  fuse_loop_cfg_set_max_threads(config.get(), options.max_threads);
  const int status = fuse_session_loop_mt(se, config.get());
  fuse_remove_signal_handlers(se);
  fuse_session_unmount(se);
  // A signal ends the loop with status = the signal number; only a negative status is a failure.
  if (status < 0)
    throw Error(ExitCode::failure, fmt::format("{}: session ended with an error", options.mountpoint));
}

}  // namespace ckptfs::fuse
