package schedule

import (
	"testing"
	"time"
)

// A union's fires are every member's, in order, a time two members give
// once; its per-day sequence counts them all; its clock changes are each
// member's.
func TestUnion(t *testing.T) {
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	must := func(expr string, loc *time.Location) Schedule {
		s, err := Parse(expr, loc)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	u := Union{must("0 0 2 * * ?", shanghai), must("0 0 14 * * ?", shanghai), must("0 0 2,20 * * ?", shanghai)}
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, shanghai)
	var got []string
	for f := u.Next(from); len(got) < 6; f = u.Next(f) {
		got = append(got, f.In(shanghai).Format("01-02 15:04"))
	}
	want := []string{"01-01 02:00", "01-01 14:00", "01-01 20:00", "01-02 02:00", "01-02 14:00", "01-02 20:00"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("fires %q, want %q (02:00, given by two members, once)", got, want)
		}
	}
	if n := Seq(u, time.Date(2027, 1, 1, 20, 0, 0, 0, shanghai)); n != 2 {
		t.Errorf("Seq of the day's third fire = %d, want 2", n)
	}
	if (Union{}).Next(from) != (time.Time{}) {
		t.Error("an empty union fires")
	}
	follows, fixed := must("0 * * * * ?", shanghai), must("0 0 2 * * ?", shanghai)
	if FollowsTheClock(follows) == FollowsTheClock(fixed) {
		t.Fatal("the test needs one schedule that follows the clock and one that does not")
	}
	if !FollowsTheClock(Union{follows, Every(30 * time.Second)}) || FollowsTheClock(Union{follows, fixed}) {
		t.Error("a union follows the clock only when every member does")
	}

	berlin, _ := time.LoadLocation("Europe/Berlin")
	dst := Union{must("0 30 2 * * ?", berlin), must("0 0 12 * * ?", berlin), must("0 15 2 * * ?", berlin)}
	ch := Changes(dst, time.Date(2027, 3, 1, 0, 0, 0, 0, berlin), time.Date(2027, 4, 1, 0, 0, 0, 0, berlin))
	if len(ch) != 2 || !ch[0].At.Equal(ch[1].At) || !ch[0].Forward {
		t.Fatalf("the spring jump: %v, want one change for each of the two members whose 02:xx it skips", ch)
	}
}
