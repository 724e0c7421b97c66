// Status propagation helpers. Debian's Abseil (20220623) ships no status macros, so the project
// keeps this one small pair. Both evaluate their expression exactly once.
#ifndef LAZYATTN_COMMON_STATUS_MACROS_H_
#define LAZYATTN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LAZYATTN_CONCAT_INNER_(a, b) a##b
#define LAZYATTN_CONCAT_(a, b) LAZYATTN_CONCAT_INNER_(a, b)

// RETURN_IF_ERROR(expr): returns the status of `expr` from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                               \
  do {                                                      \
    ::absl::Status lazyattn_status_ = (expr);               \
    if (!lazyattn_status_.ok()) return lazyattn_status_;    \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): `lhs = std::move(*expr)` when `expr` (a StatusOr) is OK, otherwise
// returns its status. `lhs` may declare a variable: ASSIGN_OR_RETURN(auto x, Parse(s));
#define ASSIGN_OR_RETURN(lhs, expr) \
  LAZYATTN_ASSIGN_OR_RETURN_IMPL_(LAZYATTN_CONCAT_(lazyattn_statusor_, __LINE__), lhs, expr)
#define LAZYATTN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // LAZYATTN_COMMON_STATUS_MACROS_H_
