//! A radix tree keyed by token ids: each edge holds a run of tokens, a node
//! may hold one snapshot id (the snapshot of the sequence spelled by the path
//! from the root). Lookups walk the prompt once; inserts split edges;
//! removals prune empty leaves and merge single-child nodes.

use std::collections::BTreeMap;

#[derive(Default, Debug)]
pub(super) struct Node {
    /// Tokens on the edge from the parent (empty at the root).
    edge: Vec<u32>,
    /// Children by the first token of their edge.
    children: BTreeMap<u32, Node>,
    snap: Option<u64>,
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Node {
    pub fn is_empty(&self) -> bool {
        self.snap.is_none() && self.children.is_empty()
    }

    /// Sets the snapshot at `key` (non-empty); returns the id it replaced.
    pub fn insert(&mut self, key: &[u32], id: u64) -> Option<u64> {
        if key.is_empty() {
            return self.snap.replace(id);
        }
        let first = key[0];
        let Some(child) = self.children.get_mut(&first) else {
            self.children.insert(
                first,
                Node {
                    edge: key.to_vec(),
                    children: BTreeMap::new(),
                    snap: Some(id),
                },
            );
            return None;
        };
        let l = common(&child.edge, key);
        if l < child.edge.len() {
            // Split the edge at l: parent -> mid (edge[..l]) -> child (edge[l..]).
            let mut old = self.children.remove(&first).expect("child exists");
            let tail = old.edge.split_off(l);
            let mid_edge = std::mem::replace(&mut old.edge, tail);
            let mut mid = Node {
                edge: mid_edge,
                children: BTreeMap::new(),
                snap: None,
            };
            mid.children.insert(old.edge[0], old);
            self.children.insert(first, mid);
        }
        self.children
            .get_mut(&first)
            .expect("child exists")
            .insert(&key[l..], id)
    }

    /// The deepest snapshot on the path of `key` whose depth is at most
    /// `max_depth`: `(id, depth)`.
    pub fn deepest(&self, key: &[u32], max_depth: usize) -> Option<(u64, usize)> {
        let mut node = self;
        let mut depth = 0;
        let mut best = None;
        while let Some(&first) = key.get(depth) {
            let Some(child) = node.children.get(&first) else {
                break;
            };
            let rest = &key[depth..];
            if rest.len() < child.edge.len() || rest[..child.edge.len()] != child.edge[..] {
                break;
            }
            depth += child.edge.len();
            if depth > max_depth {
                break;
            }
            if let Some(id) = child.snap {
                best = Some((id, depth));
            }
            node = child;
        }
        best
    }

    /// The snapshot exactly at `key`.
    pub fn get(&self, key: &[u32]) -> Option<u64> {
        self.deepest(key, key.len())
            .and_then(|(id, d)| (d == key.len()).then_some(id))
    }

    /// Removes the snapshot at `key` if it is `id`; prunes the path.
    pub fn remove(&mut self, key: &[u32], id: u64) -> bool {
        if key.is_empty() {
            if self.snap == Some(id) {
                self.snap = None;
                return true;
            }
            return false;
        }
        let first = key[0];
        let Some(child) = self.children.get_mut(&first) else {
            return false;
        };
        let n = child.edge.len();
        if key.len() < n || key[..n] != child.edge[..] {
            return false;
        }
        let removed = child.remove(&key[n..], id);
        if removed {
            if child.is_empty() {
                self.children.remove(&first);
            } else if child.snap.is_none() && child.children.len() == 1 {
                // Merge a pass-through node with its only child.
                let (_, grand) = child.children.pop_first().expect("one child");
                child.edge.extend_from_slice(&grand.edge);
                child.children = grand.children;
                child.snap = grand.snap;
            }
        }
        removed
    }

    /// Nodes in the tree (the root included); for structural checks.
    pub fn node_count(&self) -> usize {
        1 + self.children.values().map(Node::node_count).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_split_lookup_remove() {
        let mut t = Node::default();
        assert_eq!(t.insert(&[1, 2, 3, 4], 1), None);
        assert_eq!(t.insert(&[1, 2], 2), None);
        assert_eq!(t.insert(&[1, 2, 5], 3), None);
        assert_eq!(t.deepest(&[1, 2, 3, 4, 9], 4), Some((1, 4)));
        assert_eq!(t.deepest(&[1, 2, 3, 4], 3), Some((2, 2)));
        assert_eq!(t.deepest(&[1, 2, 5, 6], 10), Some((3, 3)));
        assert_eq!(t.deepest(&[1, 3], 10), None);
        assert_eq!(t.get(&[1, 2]), Some(2));
        assert_eq!(t.get(&[1, 2, 3]), None);
        assert!(t.remove(&[1, 2], 2));
        assert_eq!(t.deepest(&[1, 2, 3, 4], 3), None);
        assert!(t.remove(&[1, 2, 3, 4], 1));
        assert!(t.remove(&[1, 2, 5], 3));
        assert!(t.is_empty());
        assert_eq!(t.node_count(), 1);
    }
}
