// Compiled node stamps: the backward half of `node_stamps.py` (walk, hook, stamp) in C++.
//
// A Python node hook costs ~10 us per call and registering it another few; a sampled step of
// a 10,000-call model has ~22,000 nodes. Here the walk over a call's new nodes, the hooks and
// their bodies are C++: a body stamps CLOCK_MONOTONIC (Python's `time.perf_counter_ns`) into a
// preallocated column under a mutex, and never takes the GIL except once per backward (the
// first node, which queues the end-of-backward callback in Python).
//
// The records are those of the Python path (`NodeStamps`): same slots in the same order, same
// stamps, thread ids, nesting and AccumulateGrad rules. Built on first use by
// `native_build.py`; nothing here holds a tensor or a Python object of the user's.

#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_function.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <typeindex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

int64_t native_thread_id() {  // threading.get_native_id()
  thread_local int64_t tid = static_cast<int64_t>(syscall(SYS_gettid));
  return tid;
}

c10::intrusive_ptr<Node> node_of(PyObject* obj) {
  if (torch::autograd::THPCppFunction_Check(obj)) {
    return reinterpret_cast<torch::autograd::THPCppFunction*>(obj)->cdata;
  }
  if (THPFunction_Check(obj)) {
    return reinterpret_cast<THPFunction*>(obj)->cdata;
  }
  return {};
}

struct ThreadRun {
  std::vector<int32_t> stack;  // the slots running nested on this thread
  int64_t last = -1;           // its newest stamp: where a post-only AccumulateGrad began
};

class Stamps : public std::enable_shared_from_this<Stamps> {
 public:
  explicit Stamps(py::object on_begin) : on_begin_(on_begin.release().ptr()) {}

  ~Stamps() { drop_callback(); }

  // ---- the hooks' bodies (engine threads, no GIL) ----------------------------------------
  void pre(int32_t slot) {
    if (!armed_.load() || closed_.load()) return;
    bool begin = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_.load()) return;
      if (!started_) {
        if (accumulate_[slot]) return;  // another graph reached a shared node
        started_ = true;
        begin = true;
      }
    }
    if (begin) call_begin();
    int64_t tid = native_thread_id();
    std::lock_guard<std::mutex> lock(mu_);
    ThreadRun& run = runs_[tid];
    enclosing_[slot] = run.stack.empty() ? -1 : run.stack.back();
    run.stack.push_back(slot);
    thread_[slot] = tid;
    int64_t t = now_ns();
    t0_[slot] = t;
    run.last = t;
  }

  void post(int32_t slot) {
    if (closed_.load()) return;
    int64_t t = now_ns();
    int64_t tid = native_thread_id();
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.load()) return;
    bool began = t0_[slot] >= 0;
    if (!began && !accumulate_[slot]) return;
    ThreadRun& run = runs_[tid];
    if (!began) {
      // An AccumulateGrad node, hooked after it runs only: the engine runs it as soon as its
      // gradient is ready, so it began where this thread's previous node ended.
      if (!started_ || run.last < 0) return;
      t0_[slot] = run.last;
      enclosing_[slot] = run.stack.empty() ? -1 : run.stack.back();
      thread_[slot] = tid;
    }
    t1_[slot] = t;
    run.last = t;
    auto& stack = run.stack;
    if (!stack.empty() && stack.back() == slot) {
      stack.pop_back();
    } else {
      auto it = std::find(stack.begin(), stack.end(), slot);
      if (it != stack.end()) stack.erase(it);
    }
  }

  // ---- called from Python (GIL held) ------------------------------------------------------
  // Hook the not-yet-hooked nodes created in [lo, hi) reachable from `roots`, and the
  // AccumulateGrad nodes they feed (`NodeStamps._hook_nodes`, same order of slots).
  // The new slots' columns stay here until `table` reads them (once per step, not once per
  // call); returns how many were hooked.
  int64_t walk(const py::iterable& roots, int64_t lo, int64_t hi) {
    std::vector<std::pair<c10::intrusive_ptr<Node>, int32_t>> todo;
    for (py::handle root : roots) {
      auto node = node_of(root.ptr());
      if (node) todo.emplace_back(std::move(node), -1);
    }
    auto self = shared_from_this();
    int64_t hooked = 0;
    std::lock_guard<std::mutex> lock(mu_);
    while (!todo.empty()) {
      auto [node, via] = std::move(todo.back());
      todo.pop_back();
      auto seq = static_cast<int64_t>(node->sequence_nr());
      bool in_range = node->sequence_nr() <= static_cast<uint64_t>(INT64_MAX) && lo <= seq &&
                      seq < hi;
      int64_t bytes = 0;
      if (in_range) {
        if (!hooked_seqs_.insert(seq).second) continue;
      } else if (via >= 0) {
        auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get());
        if (acc == nullptr) continue;
        const at::Tensor& param = acc->variable;
        const void* key = param.defined() ? static_cast<const void*>(param.unsafeGetTensorImpl())
                                          : static_cast<const void*>(node.get());
        if (!accumulate_params_.insert(key).second) continue;
        if (param.defined() && !param.grad().defined()) {
          bytes = param.numel() * static_cast<int64_t>(param.element_size());
        }
      } else {
        continue;  // created before this forward (its inputs)
      }
      auto slot = static_cast<int32_t>(t0_.size());
      t0_.push_back(-1);
      t1_.push_back(-1);
      thread_.push_back(0);
      enclosing_.push_back(-1);
      accumulate_.push_back(in_range ? 0 : 1);
      seq_.push_back(in_range ? seq : -1);
      name_.push_back(name_of(*node));
      via_.push_back(in_range ? -1 : via);
      grad_new_.push_back(bytes);
      ++hooked;
      if (in_range) node->add_pre_hook(std::make_unique<PreHook>(self, slot));
      uintptr_t key = node->add_post_hook(std::make_unique<PostHook>(self, slot));
      if (!in_range) {
        persistent_.emplace_back(c10::weak_intrusive_ptr<Node>(node), key);
        continue;
      }
      for (const auto& edge : node->next_edges()) {
        if (edge.function) todo.emplace_back(edge.function, slot);
      }
    }
    return hooked;
  }

  // The columns of slots [first, end): (seq, name, via, grad_new, owner). An owner is
  // `owners[seq - seq0]`, or for an AccumulateGrad node its feeding slot's owner (`known`:
  // the owners of the slots before `first`); no `owners`: all -1 (filled in Python).
  py::tuple table(int64_t first, const std::vector<int64_t>& owners, int64_t seq0,
                  const std::vector<int64_t>& known) {
    std::lock_guard<std::mutex> lock(mu_);
    auto end = static_cast<int64_t>(seq_.size());
    py::list seqs, names, vias, grad_new, owner;
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>(std::max<int64_t>(end - first, 0)));
    for (int64_t i = first; i < end; ++i) {
      int64_t who = -1;
      if (!owners.empty()) {
        if (via_[i] < 0) {
          int64_t at = seq_[i] - seq0;
          if (at >= 0 && at < static_cast<int64_t>(owners.size())) who = owners[at];
        } else if (via_[i] >= first) {
          who = mine[via_[i] - first];
        } else if (via_[i] < static_cast<int64_t>(known.size())) {
          who = known[via_[i]];
        }
      }
      mine.push_back(who);
      seqs.append(seq_[i]);
      names.append(py::handle(name_[i]));
      vias.append(via_[i]);
      grad_new.append(grad_new_[i]);
      owner.append(who);
    }
    return py::make_tuple(seqs, names, vias, grad_new, owner);
  }

  void arm() { armed_.store(true); }

  // Closed for good (end of the backward, or the sample dropped): hooks still attached to a
  // graph the user keeps do nothing.
  void close() {
    closed_.store(true);
    drop_callback();
  }

  // The AccumulateGrad nodes' hooks come off. Only while the engine is not running them (it
  // iterates a node's hooks in place): before the backward or at its end (`NodeStamps`).
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [weak, key] : persistent_) {
      auto node = weak.lock();
      if (node) node->del_post_hook(key);
    }
    persistent_.clear();
    accumulate_params_.clear();
  }

  bool started() const { return started_; }
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(t0_.size());
  }

  // The stamps as columns: t0, t1 (None: did not run), thread, enclosing.
  py::tuple columns() {
    std::lock_guard<std::mutex> lock(mu_);
    py::list t0, t1, thread, enclosing;
    for (size_t i = 0; i < t0_.size(); ++i) {
      t0.append(t0_[i] < 0 ? py::object(py::none()) : py::object(py::int_(t0_[i])));
      t1.append(t1_[i] < 0 ? py::object(py::none()) : py::object(py::int_(t1_[i])));
      thread.append(thread_[i]);
      enclosing.append(enclosing_[i]);
    }
    return py::make_tuple(t0, t1, thread, enclosing);
  }

  // Our own time (ns) at each node's t0 and t1, from the clock's trail of (stamp, own time
  // after it) pairs in time order; `base` before the first pair.
  py::tuple own(const std::vector<int64_t>& trail, int64_t base) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = trail.size() / 2;
    std::vector<int64_t> when(n), value(n);
    for (size_t i = 0; i < n; ++i) {
      when[i] = trail[2 * i];
      value[i] = trail[2 * i + 1];
    }
    auto at = [&](int64_t stamp) -> int64_t {
      if (stamp < 0) return 0;
      auto it = std::upper_bound(when.begin(), when.end(), stamp);
      return it == when.begin() ? base : value[(it - when.begin()) - 1];
    };
    py::list own0, own1;
    for (size_t i = 0; i < t0_.size(); ++i) {
      own0.append(at(t0_[i]));
      own1.append(at(t1_[i]));
    }
    return py::make_tuple(own0, own1);
  }

  // The slots running on the calling thread, outermost first (a recompute's enclosing node).
  std::vector<int32_t> thread_stack() {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(native_thread_id());
    return it == runs_.end() ? std::vector<int32_t>{} : it->second.stack;
  }

  // The slots running on any thread (what a garbage collection pauses).
  std::vector<int32_t> running() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int32_t> out;
    for (const auto& [tid, run] : runs_) out.insert(out.end(), run.stack.begin(), run.stack.end());
    return out;
  }

 private:
  struct PreHook : torch::autograd::FunctionPreHook {
    PreHook(std::shared_ptr<Stamps> stamps, int32_t slot) : stamps(std::move(stamps)), slot(slot) {}
    variable_list operator()(const variable_list& grads) override {
      try {
        stamps->pre(slot);
      } catch (...) {
        stamps->failed.store(true);
      }
      return grads;
    }
    // Under compiled autograd the hook is left out of the compiled graph (no stamps, no error).
    void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {}
    std::shared_ptr<Stamps> stamps;
    int32_t slot;
  };

  struct PostHook : torch::autograd::FunctionPostHook {
    PostHook(std::shared_ptr<Stamps> stamps, int32_t slot) : stamps(std::move(stamps)), slot(slot) {}
    variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
      try {
        stamps->post(slot);
      } catch (...) {
        stamps->failed.store(true);
      }
      return outputs;
    }
    void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {}
    std::shared_ptr<Stamps> stamps;
    int32_t slot;
  };

  void call_begin() {
    py::gil_scoped_acquire gil;
    PyObject* fn = on_begin_;
    if (fn == nullptr) return;
    PyObject* result = PyObject_CallNoArgs(fn);
    if (result == nullptr) {
      PyErr_Clear();  // the callback reports its own errors; never into the engine
      failed.store(true);
    } else {
      Py_DECREF(result);
    }
  }

  void drop_callback() {
    PyObject* fn = on_begin_;
    on_begin_ = nullptr;
    if (fn != nullptr && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_DECREF(fn);
    }
  }

  // A node's class name as one interned Python string per name (borrowed: the strings are
  // never freed, so the columns hold no reference and need no GIL to be destroyed).
  PyObject* name_of(Node& node) {
    // Never destroyed: the interpreter may be gone when static objects are.
    static auto* by_type = new std::unordered_map<std::type_index, PyObject*>();
    static auto* by_name = new std::unordered_map<std::string, PyObject*>();
    const std::type_info& type = typeid(node);
    // Custom Python Functions share the C++ class PyNode: asked each time (by name). PyNode's
    // type info is not exported: its mangled name, stable under the Itanium ABI.
    bool shared = std::strcmp(type.name(), "N5torch8autograd6PyNodeE") == 0;
    if (!shared) {
      auto it = by_type->find(std::type_index(type));
      if (it != by_type->end()) return it->second;
    }
    std::string text = node.name();
    PyObject*& interned = (*by_name)[text];
    if (interned == nullptr) interned = py::str(text).release().ptr();
    if (!shared) (*by_type)[std::type_index(type)] = interned;
    return interned;
  }

 public:
  std::atomic<bool> failed{false};

 private:
  std::mutex mu_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> closed_{false};
  bool started_ = false;
  PyObject* on_begin_;
  std::vector<int64_t> t0_, t1_, thread_;
  std::vector<int32_t> enclosing_;
  std::vector<uint8_t> accumulate_;
  std::vector<int64_t> seq_, grad_new_;
  std::vector<int32_t> via_;
  std::vector<PyObject*> name_;  // interned, never freed (`name_of`)
  std::unordered_map<int64_t, ThreadRun> runs_;
  std::unordered_set<int64_t> hooked_seqs_;
  std::unordered_set<const void*> accumulate_params_;
  std::vector<std::pair<c10::weak_intrusive_ptr<Node>, uintptr_t>> persistent_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "wandb_modprof's compiled node stamps (capture/backward/native_stamps.cpp)";
  m.def("now_ns", &now_ns, "CLOCK_MONOTONIC in ns (time.perf_counter_ns)");
  m.def(
      "hook_counts",
      [](py::handle grad_fn) {
        auto node = node_of(grad_fn.ptr());
        if (!node) throw py::type_error("not an autograd node");
        return py::make_tuple(node->pre_hooks().size(), node->post_hooks().size());
      },
      "(pre-hooks, post-hooks) on an autograd node, Python and C++ ones alike");
  py::class_<Stamps, std::shared_ptr<Stamps>>(m, "Stamps")
      .def(py::init<py::object>())
      .def("walk", &Stamps::walk)
      .def("table", &Stamps::table)
      .def("arm", &Stamps::arm)
      .def("close", &Stamps::close)
      .def("release", &Stamps::release)
      .def("columns", &Stamps::columns)
      .def("own", &Stamps::own)
      .def("thread_stack", &Stamps::thread_stack)
      .def("running", &Stamps::running)
      .def_property_readonly("started", &Stamps::started)
      .def_property_readonly("failed", [](Stamps& s) { return s.failed.load(); })
      .def("__len__", &Stamps::size);
}
