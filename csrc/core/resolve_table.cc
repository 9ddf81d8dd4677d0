#include "lazytriton/resolve_table.h"

#include <algorithm>

namespace lt {
namespace {
bool same(const CallKey& a, const uint64_t* key, size_t n) {
  return a.size() == n && std::equal(a.begin(), a.end(), key);
}

// The one-call entry (online tuning) this thread last resolved or waited for: alive while
// its launch runs, until the thread's next resolution.
thread_local std::shared_ptr<const Entry> t_this_call;

const Entry* for_this_thread(const std::shared_ptr<const Entry>& e) {
  if (e && e->once) t_this_call = e;  // installed entries live in the table
  return e.get();
}
}  // namespace

ResolveTable::ResolveTable(std::string name, Resolver resolver)
    : name_(std::move(name)), resolver_(std::move(resolver)) {
  tables_.push_back(std::make_unique<Table>());
  table_.store(tables_.back().get());
}

ResolveTable::~ResolveTable() = default;

const Entry* ResolveTable::find(const uint64_t* key, size_t n) const noexcept {
  const Table* t = table_.load(std::memory_order_acquire);
  for (const auto& row : t->rows)
    if (same(row.first, key, n)) return row.second.get();
  return nullptr;
}

std::shared_ptr<const Entry> ResolveTable::entry(const uint64_t* key, size_t n) const {
  const Table* t = table_.load(std::memory_order_acquire);
  for (const auto& row : t->rows)
    if (same(row.first, key, n)) return row.second;
  return nullptr;
}

const Entry* ResolveTable::install(const CallKey& key, std::shared_ptr<const Entry> entry) {
  std::lock_guard<std::mutex> lock(mu_);
  // Copy-on-write: readers keep using the old table, which stays alive.
  auto next = std::make_unique<Table>(*table_.load());
  auto it = std::find_if(next->rows.begin(), next->rows.end(),
                         [&](const auto& row) { return row.first == key; });
  const Entry* out = entry.get();
  if (it != next->rows.end())
    it->second = std::move(entry);
  else
    next->rows.emplace_back(key, std::move(entry));
  table_.store(next.get(), std::memory_order_release);
  tables_.push_back(std::move(next));
  return out;
}

const Entry* ResolveTable::claim(const uint64_t* key_ptr, size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  CallKey key(key_ptr, key_ptr + n);
  for (;;) {
    if (const Entry* e = find(key_ptr, n)) return e;
    auto it = in_flight_.find(key);
    if (it == in_flight_.end()) {
      in_flight_[key] = std::make_shared<InFlight>();
      counters().resolves++;
      return nullptr;  // the caller resolves it
    }
    std::shared_ptr<InFlight> job = it->second;
    cv_.wait(lock, [&] { return job->done; });
    if (job->error) std::rethrow_exception(job->error);
    if (job->entry) return for_this_thread(job->entry);
    // Released (its owner launched its own call): this caller claims the key again.
  }
}

// Ends the resolution of `key` that claim() handed out.
void ResolveTable::finish(const CallKey& key, std::shared_ptr<const Entry> entry, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(key);
    if (it != in_flight_.end()) {
      it->second->done = true;
      it->second->error = error;
      it->second->entry = std::move(entry);
      in_flight_.erase(it);  // a failed key is retried by the next call
    }
  }
  cv_.notify_all();
}

const Entry* ResolveTable::publish(const CallKey& key, std::shared_ptr<const Entry> entry) {
  if (!entry || !entry->kernel) {
    Error error("kernel " + name_ + ": resolver returned no kernel");
    fail(key, std::make_exception_ptr(error));
    throw error;
  }
  if (!entry->once) install(key, entry);  // a one-call entry (online tuning) is not
  finish(key, entry, nullptr);
  return for_this_thread(entry);  // an installed one lives in the table
}

void ResolveTable::fail(const CallKey& key, std::exception_ptr error) { finish(key, nullptr, error); }

void ResolveTable::release(const CallKey& key) { finish(key, nullptr, nullptr); }

const Entry* ResolveTable::resolve(const uint64_t* key_ptr, size_t n, void* call_ctx) {
  if (const Entry* e = claim(key_ptr, n)) return e;
  // This caller owns the resolution; it resolves without holding the lock.
  CallKey key(key_ptr, key_ptr + n);
  std::shared_ptr<const Entry> entry;
  try {
    if (!resolver_) throw Error("kernel " + name_ + ": internal error: this table has no resolver");
    entry = resolver_(key, call_ctx);
  } catch (...) {
    fail(key, std::current_exception());
    throw;
  }
  return publish(key, std::move(entry));
}

size_t ResolveTable::size() const { return table_.load()->rows.size(); }

void ResolveTable::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  tables_.push_back(std::make_unique<Table>());
  table_.store(tables_.back().get(), std::memory_order_release);
}

}  // namespace lt
