//! A map kept by one watch's events, for those that keep less of an object than kube-runtime's
//! reflector store (which keeps it whole): an applied object's entry is put in, a deleted
//! one's taken out, and a relist replaces the whole map at its end, so that what was deleted
//! while the watch was down goes too. The one place a relist's `Init` / `InitApply` /
//! `InitDone` is buffered.

use std::collections::BTreeMap;

use kube_runtime::watcher::Event;

/// What one event changed in a [`Watched`] map.
#[derive(Debug, PartialEq)]
pub enum Update<T, K, V> {
    /// An object applied or deleted outside a relist, with its entry before and after.
    Changed {
        /// The object of the event.
        object: T,
        /// Its entry before (`None`: none).
        before: Option<V>,
        /// Its entry now (`None`: none; always for a deleted object).
        after: Option<V>,
    },
    /// A relist ended: the map holds what it returned; these entries it no longer returned.
    Relisted {
        /// Entries gone with the relist.
        gone: Vec<(K, V)>,
    },
}

/// Entries by key, kept by one watch's events (see the module).
#[derive(Debug)]
pub struct Watched<K, V> {
    now: BTreeMap<K, V>,
    /// During a relist: what it returned so far.
    listing: Option<BTreeMap<K, V>>,
}

impl<K, V> Default for Watched<K, V> {
    fn default() -> Self {
        Self {
            now: BTreeMap::new(),
            listing: None,
        }
    }
}

impl<K: Ord, V: Clone> Watched<K, V> {
    /// Applies `event`; `entry` gives an object's key and what is kept of it (`None`: nothing,
    /// as for an object that is not of interest). `None` back: nothing to tell yet (a relist
    /// under way).
    pub fn apply<T>(
        &mut self,
        event: Event<T>,
        entry: impl Fn(&T) -> (K, Option<V>),
    ) -> Option<Update<T, K, V>> {
        match event {
            Event::Apply(object) => {
                let (key, after) = entry(&object);
                let before = match after.clone() {
                    Some(value) => self.now.insert(key, value),
                    None => self.now.remove(&key),
                };
                Some(Update::Changed {
                    object,
                    before,
                    after,
                })
            }
            Event::Delete(object) => {
                let (key, _) = entry(&object);
                let before = self.now.remove(&key);
                Some(Update::Changed {
                    object,
                    before,
                    after: None,
                })
            }
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                None
            }
            Event::InitApply(object) => {
                if let (key, Some(value)) = entry(&object) {
                    self.listing.get_or_insert_default().insert(key, value);
                }
                None
            }
            Event::InitDone => {
                let listed = self.listing.take()?;
                let before = std::mem::replace(&mut self.now, listed);
                let gone = before
                    .into_iter()
                    .filter(|(key, _)| !self.now.contains_key(key))
                    .collect();
                Some(Update::Relisted { gone })
            }
        }
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.now.iter()
    }

    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.now.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.now.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object `name` worth `value` (`None`: not of interest).
    type Object = (&'static str, Option<u32>);

    fn entry(object: &Object) -> (&'static str, Option<u32>) {
        *object
    }

    fn entries(map: &Watched<&'static str, u32>) -> Vec<(&'static str, u32)> {
        map.iter().map(|(k, v)| (*k, *v)).collect()
    }

    #[test]
    fn applied_and_deleted_objects_say_what_they_changed() {
        let mut map = Watched::default();
        let changed = |object: Object, before, after| {
            Some(Update::Changed {
                object,
                before,
                after,
            })
        };
        type Expected = Option<Update<Object, &'static str, u32>>;
        let cases: [(Event<Object>, Expected); 5] = [
            (
                Event::Apply(("a", Some(1))),
                changed(("a", Some(1)), None, Some(1)),
            ),
            (
                Event::Apply(("a", Some(2))),
                changed(("a", Some(2)), Some(1), Some(2)),
            ),
            (Event::Apply(("b", None)), changed(("b", None), None, None)),
            (
                Event::Apply(("a", None)),
                changed(("a", None), Some(2), None),
            ),
            (
                Event::Delete(("c", Some(3))),
                changed(("c", Some(3)), None, None),
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(map.apply(event, entry), expected);
        }
        assert!(map.is_empty(), "an entry of no interest is taken out");
    }

    #[test]
    fn a_relist_replaces_the_map_at_its_end_and_names_what_it_no_longer_returned() {
        let mut map = Watched::default();
        map.apply(Event::Apply(("a", Some(1))), entry);
        map.apply(Event::Apply(("b", Some(2))), entry);
        assert_eq!(map.apply(Event::Init, entry), None);
        assert_eq!(map.apply(Event::InitApply(("b", Some(5))), entry), None);
        assert_eq!(map.apply(Event::InitApply(("c", Some(3))), entry), None);
        assert_eq!(map.apply(Event::InitApply(("d", None)), entry), None);
        assert_eq!(
            entries(&map),
            [("a", 1), ("b", 2)],
            "the old entries until the relist ends"
        );
        assert_eq!(
            map.apply(Event::InitDone, entry),
            Some(Update::Relisted {
                gone: vec![("a", 1)]
            })
        );
        assert_eq!(entries(&map), [("b", 5), ("c", 3)]);
        assert_eq!(map.len(), 2);
        assert_eq!(
            map.apply(Event::InitDone, entry),
            None,
            "no relist under way"
        );
    }

    #[test]
    fn a_relist_of_nothing_empties_the_map() {
        let mut map = Watched::default();
        map.apply(Event::Apply(("a", Some(1))), entry);
        map.apply(Event::Init, entry);
        assert_eq!(
            map.apply(Event::InitDone, entry),
            Some(Update::Relisted {
                gone: vec![("a", 1)]
            })
        );
        assert!(map.is_empty());
    }
}
