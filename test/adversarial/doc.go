// Package adversarial holds Embark's attack tests: each test is one attack
// against the real endpoint, xDS server or registry (as an attacker would run
// it) and fails if the attack succeeds. TestMain prints a summary line,
// "adversarial: N attacks tried, N refused", that CI shows.
//
// Every attack test starts with Attack(t, "what is tried"); an attack counts
// as refused when its test passes.
package adversarial
