#include "mergepipe/thread_name.hpp"

#if defined(__linux__)
#include <pthread.h>
#endif

namespace mergepipe {

void name_this_thread([[maybe_unused]] const char* name) noexcept {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#endif
}

}  // namespace mergepipe
