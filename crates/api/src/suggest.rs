//! "Did you mean …?" suggestions for misspelled names.

/// The candidate closest to `input` by edit distance (ignoring case), when it is close enough
/// to be a plausible typo.
pub fn closest<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = input.chars().count();
    let limit = (len / 3).clamp(1, 3);
    let needle = input.to_ascii_lowercase();
    candidates
        .into_iter()
        // Lengths further apart than the limit cannot be within it; skipping them also keeps
        // a megabyte-long name from costing a megabyte-squared comparison.
        .filter(|c| c.chars().count().abs_diff(len) <= limit)
        .map(|c| (edit_distance(&needle, &c.to_ascii_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = substitution.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_names_only() {
        assert_eq!(edit_distance("cidr", "cidrr"), 1);
        assert_eq!(closest("cidrr", ["cidr", "blockSize"]), Some("cidr"));
        assert_eq!(closest("natoutgoing", ["natOutgoing"]), Some("natOutgoing"));
        assert_eq!(closest("zzzzzz", ["cidr", "blockSize"]), None);
        // Not quadratic in a huge input (before: minutes in a debug build).
        let start = std::time::Instant::now();
        assert_eq!(closest(&"k".repeat(1 << 20), ["IPPool", "kkkk"]), None);
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
}
