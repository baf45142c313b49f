// Preloaded into trace-cmd by record.sh on hosts without the function tracer (this project's
// PVM host): `trace-cmd record` writes set_ftrace_pid, set_ftrace_filter and
// /proc/sys/kernel/ftrace_enabled even when it records only events, and the kernel refuses
// them (EPERM), which kills the recording. Opens of those files get /dev/null instead; every
// other open goes through untouched.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>

static int function_tracer_file(const char *path)
{
	return path && (strstr(path, "set_ftrace") || strstr(path, "set_graph") || strstr(path, "ftrace_enabled"));
}

int openat(int dirfd, const char *path, int flags, ...)
{
	static int (*real)(int, const char *, int, ...);
	va_list ap;
	int mode;

	if (!real)
		real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
	va_start(ap, flags);
	mode = va_arg(ap, int);
	va_end(ap);
	if (function_tracer_file(path))
		return real(AT_FDCWD, "/dev/null", flags & ~(O_TRUNC | O_CREAT), 0);
	return real(dirfd, path, flags, mode);
}

int open(const char *path, int flags, ...)
{
	va_list ap;
	int mode;

	va_start(ap, flags);
	mode = va_arg(ap, int);
	va_end(ap);
	return openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	va_list ap;
	int mode;

	va_start(ap, flags);
	mode = va_arg(ap, int);
	va_end(ap);
	return open(path, flags, mode);
}
