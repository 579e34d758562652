#pragma once

namespace mergepipe {

// Names the calling thread (at most 15 characters shown), so `top -H`, `perf --sort comm` and
// debuggers tell MergePipe's readers, workers and writers apart. Best effort: a platform
// without thread names ignores it.
void name_this_thread(const char* name) noexcept;

}  // namespace mergepipe
