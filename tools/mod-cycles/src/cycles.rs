//! Cycles of a directed graph: its strongly connected components (Tarjan), and in each one
//! a set of shortest cycles that together cover every edge inside it — so a report names
//! every reference that takes part in a cycle, without listing the (exponentially many)
//! elementary cycles.

use std::collections::{BTreeSet, VecDeque};

/// The cycles among `nodes` nodes joined by `edges` (`from`, `to`), each as the indices into
/// `edges` of its edges in order, starting at its smallest node. Self-loops are ignored.
pub fn cycles(nodes: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    let component = components(nodes, edges);
    let mut out = Vec::new();
    let mut covered = vec![false; edges.len()];
    for (e, &(from, to)) in edges.iter().enumerate() {
        if covered.get(e).copied().unwrap_or(true)
            || from == to
            || component.get(from) != component.get(to)
        {
            continue;
        }
        // the shortest way back from `to` to `from`, inside the component
        let Some(back) = shortest_path(nodes, edges, to, from, |n| {
            component.get(n) == component.get(from)
        }) else {
            continue;
        };
        let mut cycle = vec![e];
        cycle.extend(back);
        for &c in &cycle {
            if let Some(slot) = covered.get_mut(c) {
                *slot = true;
            }
        }
        let start = cycle
            .iter()
            .enumerate()
            .min_by_key(|(_, &c)| edges.get(c).map_or(usize::MAX, |&(f, _)| f))
            .map_or(0, |(k, _)| k);
        cycle.rotate_left(start);
        out.push(cycle);
    }
    out
}

/// The edges of a shortest path from `from` to `to` through nodes that `inside` accepts.
fn shortest_path(
    nodes: usize,
    edges: &[(usize, usize)],
    from: usize,
    to: usize,
    inside: impl Fn(usize) -> bool,
) -> Option<Vec<usize>> {
    let mut via: Vec<Option<usize>> = vec![None; nodes];
    let mut seen = BTreeSet::from([from]);
    let mut queue = VecDeque::from([from]);
    while let Some(n) = queue.pop_front() {
        if n == to {
            let mut path = Vec::new();
            let mut at = to;
            while at != from {
                let e = (*via.get(at)?)?;
                path.push(e);
                at = edges.get(e)?.0;
            }
            path.reverse();
            return Some(path);
        }
        for (e, &(f, t)) in edges.iter().enumerate() {
            if f == n && inside(t) && seen.insert(t) {
                *via.get_mut(t)? = Some(e);
                queue.push_back(t);
            }
        }
    }
    None
}

/// Each node's strongly connected component (an index shared by the nodes of one component).
fn components(nodes: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    struct Tarjan<'e> {
        edges: &'e [(usize, usize)],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        component: Vec<usize>,
        components: usize,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            let (Some(index), Some(low), Some(on)) = (
                self.index.get_mut(v),
                self.low.get_mut(v),
                self.on_stack.get_mut(v),
            ) else {
                return;
            };
            *index = Some(self.next);
            *low = self.next;
            *on = true;
            self.next += 1;
            self.stack.push(v);
            let edges = self.edges;
            for &(_, w) in edges.iter().filter(|(f, _)| *f == v) {
                match self.index.get(w).copied().flatten() {
                    None => {
                        self.visit(w);
                        let w_low = self.low.get(w).copied().unwrap_or(usize::MAX);
                        if let Some(low) = self.low.get_mut(v) {
                            *low = (*low).min(w_low);
                        }
                    }
                    Some(w_index) if self.on_stack.get(w).copied().unwrap_or(false) => {
                        if let Some(low) = self.low.get_mut(v) {
                            *low = (*low).min(w_index);
                        }
                    }
                    Some(_) => {}
                }
            }
            if self.low.get(v) == self.index.get(v).copied().flatten().as_ref() {
                while let Some(w) = self.stack.pop() {
                    if let Some(on) = self.on_stack.get_mut(w) {
                        *on = false;
                    }
                    if let Some(c) = self.component.get_mut(w) {
                        *c = self.components;
                    }
                    if w == v {
                        break;
                    }
                }
                self.components += 1;
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: vec![None; nodes],
        low: vec![0; nodes],
        on_stack: vec![false; nodes],
        stack: Vec::new(),
        next: 0,
        component: vec![0; nodes],
        components: 0,
    };
    for v in 0..nodes {
        if t.index.get(v).copied().flatten().is_none() {
            t.visit(v);
        }
    }
    t.component
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cycles as node sequences.
    fn node_cycles(nodes: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
        cycles(nodes, edges)
            .into_iter()
            .map(|c| c.into_iter().map(|e| edges[e].0).collect())
            .collect()
    }

    #[test]
    fn acyclic_graphs_have_none() {
        assert!(cycles(4, &[(0, 1), (1, 2), (0, 2), (2, 3), (1, 1)]).is_empty());
        assert!(cycles(0, &[]).is_empty());
    }

    #[test]
    fn two_and_three_node_cycles() {
        assert_eq!(node_cycles(3, &[(1, 0), (0, 1), (2, 0)]), [vec![0, 1]]);
        assert_eq!(
            node_cycles(4, &[(3, 1), (1, 2), (2, 3), (0, 1)]),
            [vec![1, 2, 3]]
        );
    }

    #[test]
    fn every_edge_of_a_component_is_covered() {
        // 0 ⇄ 1, 1 ⇄ 2, and 3 ⇄ 4 apart
        let edges = [(0, 1), (1, 0), (1, 2), (2, 1), (3, 4), (4, 3)];
        let found = cycles(5, &edges);
        assert_eq!(found.len(), 3, "{found:?}");
        let mut used: Vec<usize> = found.concat();
        used.sort_unstable();
        assert_eq!(used, [0, 1, 2, 3, 4, 5]);
        assert_eq!(node_cycles(5, &edges), [vec![0, 1], vec![1, 2], vec![3, 4]]);
    }
}
