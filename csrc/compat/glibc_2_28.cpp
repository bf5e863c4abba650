// The manylinux_2_28 floor (torch's own) for host code built on newer distributions.
//
// libstdc++ >= 11 headers read glibc's `__libc_single_threaded` (GLIBC_2.32) wherever a
// reference count changes (std::shared_ptr, std::string's COW-free paths, locale facets), when
// the build's glibc has <sys/single_threaded.h>. That one import would make the extension need
// glibc 2.32. This hidden definition binds those reads inside our own library instead: its value
// is always 0 ("other threads may exist"), so libstdc++ always takes the atomic path, which is
// correct in every process and is what it does anyway once a second thread has started.
// checks.check_floor and auditwheel repair --plat prove the wheel needs nothing past 2_28.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
