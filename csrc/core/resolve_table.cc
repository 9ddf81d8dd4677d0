#include "lazytriton/resolve_table.h"

#include <algorithm>

namespace lt {
namespace {
bool same(const CallKey& a, const uint64_t* key, size_t n) {
  return a.size() == n && std::equal(a.begin(), a.end(), key);
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

const Entry* ResolveTable::resolve(const uint64_t* key_ptr, size_t n, void* call_ctx) {
  CallKey key(key_ptr, key_ptr + n);
  std::shared_ptr<InFlight> job;
  bool owner = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (const Entry* e = find(key_ptr, n)) return e;
    auto it = in_flight_.find(key);
    if (it == in_flight_.end()) {
      job = std::make_shared<InFlight>();
      in_flight_[key] = job;
      owner = true;
    } else {
      job = it->second;
      cv_.wait(lock, [&] { return job->done; });
      if (job->error) std::rethrow_exception(job->error);
      return job->entry;
    }
  }
  // Only the owner gets here; it resolves without holding the lock.
  std::shared_ptr<const Entry> entry;
  std::exception_ptr error;
  try {
    counters().resolves++;
    entry = resolver_(key, call_ctx);
    if (!entry || !entry->kernel) throw Error("kernel " + name_ + ": resolver returned no kernel");
  } catch (...) {
    error = std::current_exception();
  }
  const Entry* installed = error ? nullptr : install(key, std::move(entry));
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->done = true;
    job->error = error;
    job->entry = installed;
    in_flight_.erase(key);  // a failed key is retried by the next call
  }
  cv_.notify_all();
  if (error) std::rethrow_exception(error);
  return installed;
}

size_t ResolveTable::size() const { return table_.load()->rows.size(); }

void ResolveTable::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  tables_.push_back(std::make_unique<Table>());
  table_.store(tables_.back().get(), std::memory_order_release);
}

}  // namespace lt
