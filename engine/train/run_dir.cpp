#include "engine/train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace tmx {
namespace fs = std::filesystem;
namespace {

// What an interrupted write leaves in a run directory: the checkpoint writer's temporary
// directory "step_N.tmp-PID" / "best.tmp-PID", and write_file_atomic's "metrics.jsonl.tmp.PID".
bool is_leftover_name(const std::string& name) {
    for (const char* marker : {".tmp-", ".tmp."}) {
        const size_t at = name.rfind(marker);
        if (at == std::string::npos || at == 0) continue;
        const std::string base = name.substr(0, at), pid = name.substr(at + std::strlen(marker));
        const bool numeric = !pid.empty() && std::all_of(pid.begin(), pid.end(), [](char c) {
            return c >= '0' && c <= '9';
        });
        if (numeric && (step_of_dir_name(base) || base == kBestDir || base == kMetricsFile))
            return true;
    }
    return false;
}

// "run/step_5/" and "run/step_5" name the same checkpoint; "step_5" lies in ".".
fs::path normalized(const std::string& path) {
    fs::path p = fs::path(path).lexically_normal();
    if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
    return p;
}

}  // namespace

std::optional<int64_t> step_of_dir_name(const std::string& name) {
    const size_t prefix = std::strlen(kStepPrefix);
    if (name.rfind(kStepPrefix, 0) != 0 || name.size() == prefix || name.size() > prefix + 18)
        return std::nullopt;
    if (!std::all_of(name.begin() + prefix, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    return std::stoll(name.substr(prefix));
}

std::string step_dir_name(int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%08lld", kStepPrefix, static_cast<long long>(step));
    return buf;
}

bool is_step_dir(const fs::path& p) {
    return step_of_dir_name(p.filename().string()) && fs::exists(p / kStateFile);
}

void remove_leftovers(const fs::path& run_dir) {
    for (const auto& entry : fs::directory_iterator(run_dir))
        if (is_leftover_name(entry.path().filename().string())) {
            std::error_code ignored;
            fs::remove_all(entry.path(), ignored);
        }
}

fs::path parent_or_dot(const fs::path& p) {
    return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

RunDirLock::RunDirLock(const fs::path& run_dir) {
    const std::string path = (run_dir / kLockFile).string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot open the run's lock file: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS)
            return;  // a file system without locks: train unlocked rather than not at all
        std::string holder(256, '\0');
        const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
        holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
        holder.erase(std::find(holder.begin(), holder.end(), '\n'), holder.end());
        ::close(fd_);
        if (err != EWOULDBLOCK)
            throw Error(path + ": cannot lock the run directory: " + std::strerror(err));
        throw Error(run_dir.string() + ": the run is in use by another tmx train (" +
                    (holder.empty() ? std::string("its holder is starting") : holder) +
                    "); wait for it to end or stop it first");
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    const std::string holder =
        "pid " + std::to_string(::getpid()) + " on host " + std::string(host) + "\n";
    // The holder's name is for the message only: a failure to write it is no reason to stop.
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, holder.data(), holder.size(), 0);
}

RunDirLock::~RunDirLock() {
    ::close(fd_);
}

std::string resolve_run_checkpoint(const std::string& path) {
    return filesystem_errors_as_errors([&] {
        const fs::path p = normalized(path);
        if (is_leftover_name(p.filename().string()))
            throw Error(path +
                        ": an unfinished checkpoint left by an interrupted write (resume "
                        "the run directory " +
                        parent_or_dot(p).string() + ", whose next run removes it)");
        if (fs::exists(p / kStateFile)) return p.string();
        if (!fs::is_directory(p)) throw Error(path + ": no such run directory or checkpoint");
        fs::path latest;
        int64_t latest_step = -1;
        for (const auto& entry : fs::directory_iterator(p)) {
            const std::optional<int64_t> step = step_of_dir_name(entry.path().filename().string());
            if (step && *step > latest_step && entry.is_directory() && is_step_dir(entry.path())) {
                latest = entry.path();
                latest_step = *step;
            }
        }
        if (latest.empty())
            throw Error(path + ": not a training run (no step_* checkpoint with " + kStateFile +
                        ")");
        return latest.string();
    });
}

}  // namespace tmx
