/* LD_PRELOAD helper: on SIGSEGV / SIGBUS / SIGFPE / SIGILL / SIGABRT, prints the faulting address and the
 * native call stack (module + offset of each frame, and the symbol where the module exports one) to stderr,
 * then dies of the same signal. Python's faulthandler shows only Python frames; this shows which C++
 * function crashed. Built and used by tools/native_backtrace.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
#include <string.h>
#include <unistd.h>

static void print_frame(const char* label, int i, void* pc) {
  Dl_info where;
  if (dladdr(pc, &where) && where.dli_fname) {
    dprintf(2, "=== %s %2d %s +0x%lx %s\n", label, i, where.dli_fname,
            (unsigned long)((char*)pc - (char*)where.dli_fbase), where.dli_sname ? where.dli_sname : "?");
  } else {
    dprintf(2, "=== %s %2d %p\n", label, i, pc);
  }
}

static void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  const ucontext_t* uc = (const ucontext_t*)context;
  /* the faulting instruction and stack pointer first: a stack overflow (fault address just below the stack
     pointer) shows here even if the unwinder fails */
  dprintf(2, "\n=== native backtrace: signal %d at address %p, stack pointer %p\n", sig, info ? info->si_addr : NULL,
          (void*)uc->uc_mcontext.gregs[REG_RSP]);
  print_frame("pc   ", 0, (void*)uc->uc_mcontext.gregs[REG_RIP]);
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    print_frame("frame", i, frames[i]);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install_handlers(void) {
  /* the handler runs on its own stack, so a stack overflow is reported too; backtrace() once here loads
     the unwinder, which the handler must not load */
  static char alt_stack[1 << 16];
  stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof(alt_stack), .ss_flags = 0};
  sigaltstack(&ss, NULL);
  void* warm[2];
  backtrace(warm, 2);
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (unsigned i = 0; i < sizeof(signals) / sizeof(signals[0]); ++i) {
    sigaction(signals[i], &action, NULL);
  }
}
